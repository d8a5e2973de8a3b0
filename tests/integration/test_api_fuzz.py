"""The API fuzzed from its own OpenAPI document, against the real server of the session stack.

Schemathesis turns every operation of /api/v1/openapi.json into a Hypothesis strategy: requests
that fit the schema (positive) and requests that break it (negative: wrong types, missing
fields, strings where numbers go, ...). Each is sent to the running uvicorn as a user with a
small quota of their own, and must get:
- no 5xx;
- a status code the document declares, with a body that matches the declared schema and
  content type; a request the document forbids is refused;
- for a refused request (4xx) to an operation that changes things: no change at all, in the
  user's jobs (their ids, names, baselines, states and what each holds, whose sum is the
  quota's use) or in the nodes (drained or not, capacity).

Path parameters are drawn both at random and as the user's own finished job, so that requests
reach the code behind the 404 too; job submissions are also made of the catalog's real names,
so that they reach the checks of meaning and the quota, and some are accepted: those real jobs
are cancelled at once. Every path is then sent each method it does not take, which must answer
405 in the API's error form, with Allow. The counts go to the end of the run's output.
"""

import collections
import dataclasses
import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err, Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from jobs import healthrules, text
from tests.conftest import FUZZ_SUMMARY, RunningStack, StackClient, pytorch_request
from tests.json_documents import paths, replaced

EXAMPLES_PER_MODE = 20  # per operation; derandomized, so every run sends the same requests
# Requests that fit the document but for one string that is not text (jobs/text.py): a lone
# surrogate (sent as the JSON escape "\ud800"), NUL, a bidi override, a newline. Schemathesis
# never draws lone surrogates itself (it cannot put them on the wire as UTF-8).
TAINTED_EXAMPLES = 10
# Bodies for POST /jobs built from the catalog's own names: random strings never name a real
# image or package, so without these no request would get past the first check of meaning.
SUBMISSIONS = 40
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,  # a request the document forbids is refused
]
CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
TERMINAL = {"succeeded", "failed", "cancelled"}
# Sent to every path with each of these methods that it does not take: a 405 in the API's form.
METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
LAUNCHING = {"POST /api/v1/jobs", "POST /api/v1/jobs/{job_id}/baseline-run"}


@pytest.fixture(scope="module")
def fuzzer(stack: RunningStack) -> Iterator[StackClient]:
    """A user of their own: what they submit runs on the shared stack, so their quota is
    small, and every job they leave is cancelled afterwards."""
    client = stack.create_user(
        "fuzzer", "fuzzer-password", quota={"cpu": 2, "gpus": 0, "memory_gb": 8, "running_jobs": 1}
    )
    yield client
    for experiment in client.http.get("/api/v1/experiments").json()["experiments"]:
        stop_experiment(client, experiment["id"])
    for job in client.http.get("/api/v1/jobs", params={"limit": 200}).json()["jobs"]:
        client.http.post(f"/api/v1/jobs/{job['id']}/cancel", json={})
    for job in client.http.get("/api/v1/jobs", params={"limit": 200}).json()["jobs"]:
        client.wait(job["id"], lambda j: j["state"] in TERMINAL)


def stop_experiment(user: StackClient, experiment_id: int) -> None:
    """End a search the fuzz got accepted, and wait until no trial of it is left running."""
    user.http.post(f"/api/v1/experiments/{experiment_id}/stop", json={})
    detail = user.http.get(f"/api/v1/experiments/{experiment_id}").json()
    for trial in detail["trials"]:
        if trial["job"] is not None:
            user.wait(trial["job"], lambda job: job["state"] in TERMINAL)


def snapshot(user: StackClient, admin: StackClient) -> dict[str, Any]:
    """What a refused request must leave as it was: the user's jobs, with what each holds (the
    quota's use is their sum), their code snapshots, and the nodes. Every job the fuzz gets
    accepted is cancelled and has ended before the next request, so nothing here changes on
    its own meanwhile."""
    jobs = user.http.get("/api/v1/jobs", params={"limit": 200}).json()["jobs"]
    nodes = admin.http.get("/api/v1/nodes").json()["nodes"]
    uploads = user.http.get("/api/v1/snapshots").json()["snapshots"]
    return {
        "snapshots": sorted((u["sha256"], u["name"]) for u in uploads),
        "jobs": {j["id"]: (j["name"], j["baseline"], j["state"], j["totals"]) for j in jobs},
        # The stack's own nodes: other tests leave agents of theirs (an "old-1" of the protocol
        # tests) whose status moves with time alone (draining, then lost once stale).
        "nodes": {
            n["name"]: (n["status"] == "draining", n["capacity"])
            for n in nodes
            if n["name"].startswith("node-")
        },
    }


def submissions(catalog: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Job requests made of the catalog's names: half of them plausible (an image with its
    roles, packages those roles may use, an example of its framework, a few instances: some
    fit the quota, some are over it), half wild (any name, role or number). Options, metric
    definitions and health rules at random in both, non-finite numbers included (Python's
    JSON sends NaN and Infinity)."""
    text = st.text(WIDE_ALPHABET, max_size=12)
    numbers = st.integers(-2, 5) | st.integers() | st.floats()
    json_values = st.recursive(
        st.none() | st.booleans() | numbers | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=6,
    )
    images = [image["name"] for image in catalog["images"]]
    roles = sorted({role for image in catalog["images"] for role in image["roles"]})
    packages = [package["name"] for package in catalog["packages"]]
    scripts = [example["name"] for example in catalog["examples"]] + [
        "report_metrics.py",
        "fail.py",
        "../etc/passwd",
    ]
    modes = sorted({mode for image in catalog["images"] for mode in image["kvstore_modes"]})
    restart = st.fixed_dictionaries(
        {},
        optional={
            "policy": st.sampled_from(["never", "on-failure"]) | text,
            "max_restarts": st.integers(-1, 101) | st.integers(),
            "backoff_seconds": st.integers(-1, 3601),
            "exclude_failed_node": st.booleans(),
        },
    )
    metric = st.fixed_dictionaries(
        {"name": st.sampled_from(["loss", "acc/top1"]) | text},
        optional={"regex": st.sampled_from([r"loss=(\S+)", "(", "no group", "(a*)*$"]) | text},
    )
    # The rules' own vocabulary (jobs.healthrules), so that a new kind or parameter is fuzzed
    # too: every parameter with values of any type, or ones some rule takes.
    parameters = sorted(
        {key for keys in healthrules.PARAMS.values() for key in keys}
        | set(healthrules.COMMON_KEYS) - {"kind", "action"}
    )
    rule = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(healthrules.KINDS) | text,
            "action": st.sampled_from(healthrules.ACTIONS),
        },
        optional={
            key: json_values | st.sampled_from(["loss", "*", "error", "", "x*", "stderr", 10])
            for key in parameters
        },
    )
    options = {
        "kvstore": st.none() | st.sampled_from(modes) | text,
        "restart": st.none() | restart,
        "metrics": st.none() | st.lists(metric, max_size=2) | json_values,
        "health_rules": st.none() | st.lists(rule, max_size=2) | json_values,
    }

    @st.composite
    def plausible(draw: st.DrawFn) -> dict[str, Any]:
        image = draw(st.sampled_from(catalog["images"]))
        examples = [e["name"] for e in catalog["examples"] if e["framework"] == image["framework"]]
        roles = {}
        for role in image["roles"]:
            usable = [p for p in catalog["packages"] if role in p["roles"] or not p["roles"]]
            smallest = min(usable or catalog["packages"], key=lambda p: (p["cpu"], p["memory_gb"]))
            # The platform starts the scheduler by itself: asked for, it is refused.
            if role == "scheduler" and draw(st.integers(0, 3)):
                continue
            if draw(st.integers(0, 4)):  # now and then a role is left out
                package = draw(st.just(smallest["name"]) | st.sampled_from(packages))
                instances = draw(st.just(1) | st.integers(0, 2))
                roles[role] = {"package": package, "instances": instances}
        body = {
            "name": "fuzz",
            "image": image["name"],
            "program": {
                "script": draw(st.sampled_from([*examples, "report_metrics.py"])),
                "args": draw(st.lists(st.sampled_from(["--epochs", "1", "--steps", "-x"]))),
            },
            "roles": roles,
        }
        if image["kvstore_modes"]:
            body["kvstore"] = draw(st.sampled_from(image["kvstore_modes"]))
        if draw(st.booleans()):
            body |= draw(st.fixed_dictionaries({}, optional=options))
        return body

    wild = st.fixed_dictionaries(
        {
            "name": st.just("fuzz") | text,
            "image": st.sampled_from(images) | text,
            "program": st.fixed_dictionaries(
                {"script": st.sampled_from(scripts) | text, "args": st.lists(text, max_size=3)}
            ),
            "roles": st.dictionaries(
                st.sampled_from(roles) | text,
                st.fixed_dictionaries(
                    {
                        "package": st.sampled_from(packages) | text,
                        "instances": st.integers(-1, 3) | numbers,
                    }
                ),
                max_size=4,
            ),
        },
        optional=options,
    )
    return plausible() | wild


# Every character, lone surrogates included, and the ones names refuse made likely.
WIDE_ALPHABET = (
    st.characters(codec=None)
    | st.characters(categories=["Cs"])
    | st.sampled_from("\x00\n\t\u202e\u2066\u200b\ufeff\x1b")
)
BAD_TEXT = st.sampled_from(["\ud800", "a\udfffb", "a\x00b", "job\u202etxt.exe", "two\nlines"]) | (
    st.text(WIDE_ALPHABET, min_size=1, max_size=8).filter(lambda t: text.text_problem(t))
)
# A URL and a multipart form carry UTF-8: a lone surrogate cannot be sent in one (the client
# fails to encode it); only JSON has an escape for it.
BAD_WIRE_TEXT = BAD_TEXT.filter(lambda t: not any("\ud800" <= c <= "\udfff" for c in t))


def tainted(operation: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid requests with one value, key or query parameter made of text that is not."""

    @st.composite
    def draw_case(draw: st.DrawFn) -> Any:
        case = draw(strategy)
        places = [("query", name) for name in case.query]
        body = case.body if isinstance(case.body, (dict, list)) else {}
        if operation.body:  # an operation that takes a body
            places += [("body", path) for path in [(), *paths(body)]]
            if isinstance(body, dict):
                places.append(("key", ()))
        if not places:
            return case
        where, what = draw(st.sampled_from(places))
        query = dict(case.query)
        bad = BAD_TEXT if case.media_type == "application/json" else BAD_WIRE_TEXT
        if where == "query":
            query[what] = draw(BAD_WIRE_TEXT)
            body = case.body
        elif where == "key" and isinstance(body, dict):
            body = {**body, draw(bad): "x"}
        else:
            body = replaced(body, what, draw(bad))
        return operation.Case(
            path_parameters=case.path_parameters,
            query=query,
            body=body,
            media_type=case.media_type,
        )

    return draw_case()


def json_case(operation: Any, body: Any) -> Any:
    return operation.Case(body=body, media_type="application/json")


@dataclasses.dataclass
class Tally:
    sent: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    server_errors: int = 0
    outside_schema: int = 0
    refused_unchanged: int = 0
    accepted_jobs: int = 0
    wrong_methods: int = 0
    bad_text: int = 0  # requests with a string that is not text
    nothing_to_break: list[str] = dataclasses.field(default_factory=list)


def for_each_example(
    strategy: st.SearchStrategy[Any], test: Callable[[Any], None], examples: int
) -> None:
    """Run `test` on up to `examples` examples; a failure is shrunk to its simplest."""

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        test(case)

    run()


def test_no_input_gets_a_server_error_or_an_undocumented_answer(
    stack: RunningStack, fuzzer: StackClient, pytestconfig: pytest.Config
) -> None:
    own_job = fuzzer.submit(pytorch_request("fuzz target", "report_metrics.py", 1))
    fuzzer.wait_finished(own_job["id"])
    catalog = fuzzer.http.get("/api/v1/catalog").json()
    schema = schemathesis.openapi.from_url(
        f"{stack.url}/api/v1/openapi.json", headers=fuzzer.http.headers
    )
    auth = {"Authorization": f"Token {fuzzer.token}"}
    tally = Tally()
    results = list(schema.get_all_operations())
    invalid = [r.err() for r in results if isinstance(r, Err)]
    assert not invalid, f"the document has operations Schemathesis cannot read: {invalid}"
    operations = [r.ok() for r in results if isinstance(r, Ok)]

    # The state after the last request, while known: a refused request's "after" is the next
    # one's "before", which halves the reads (no GET may change anything either).
    known: dict[str, Any] | None = None

    def state_before() -> dict[str, Any]:
        nonlocal known
        before, known = known or snapshot(fuzzer, stack.admin), None
        return before

    def unchanged_since(before: dict[str, Any], label: str, response: Any) -> None:
        nonlocal known
        after = snapshot(fuzzer, stack.admin)
        assert after == before, (
            f"{label} was refused with {response.status_code} "
            f"but changed something: {response.text[:300]}"
        )
        tally.refused_unchanged += 1
        known = after

    def check(case: Any, label: str, raw_json: bool = False, bad_text: bool = False) -> None:
        before = state_before() if case.method.upper() in CHANGING else None
        if raw_json:  # as Python writes it, NaN and Infinity included (the client refuses them)
            response = fuzzer.http.request(
                case.method,
                case.formatted_path,
                content=json.dumps(case.body),
                headers={"Content-Type": "application/json"},
            )
        else:
            response = case.call(base_url=stack.url, headers=auth, timeout=30)
        tally.sent[label] += 1
        tally.server_errors += response.status_code >= 500
        tally.bad_text += bad_text
        if response.status_code == 201 and label in LAUNCHING:
            # A real job on the shared stack: ended at once, so that it costs the other tests
            # next to nothing and changes nothing on its own while later requests are checked.
            tally.accepted_jobs += 1
            job_id = response.json()["id"]
            fuzzer.http.post(f"/api/v1/jobs/{job_id}/cancel", json={})
            fuzzer.wait(job_id, lambda job: job["state"] in TERMINAL)
        if response.status_code == 201 and label == "POST /api/v1/experiments":
            # A search would go on submitting trials of its own: stopped at once, likewise.
            stop_experiment(fuzzer, response.json()["id"])
        try:
            case.validate_response(response, checks=CHECKS, headers=auth)
        except Exception:
            tally.outside_schema += response.status_code < 500
            raise
        if before is not None and 400 <= response.status_code < 500:
            unchanged_since(before, label, response)

    def check_wrong_method(method: str, path: str, url: str, allowed: set[str]) -> None:
        before = state_before()
        response = fuzzer.http.request(method, url)
        tally.wrong_methods += 1
        tally.server_errors += response.status_code >= 500
        label = f"{method} {path}"
        assert response.status_code == 405, (label, response.status_code, response.text[:300])
        assert set(response.headers["Allow"].split(", ")) == allowed, label
        assert response.headers["Content-Type"] == "application/json", label
        assert list(response.json()) == ["errors"], label
        assert [type(m) for m in response.json()["errors"]["request"]] == [str], label
        unchanged_since(before, label, response)

    def fuzz(label: str, strategy: st.SearchStrategy[Any], examples: int, **how: Any) -> None:
        for_each_example(strategy, functools.partial(check, label=label, **how), examples)

    try:
        for operation in operations:
            label = f"{operation.method.upper()} {operation.path}"
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                strategy = operation.as_strategy(generation_mode=mode)
                if "job_id" in operation.path:
                    strategy = st.one_of(
                        strategy,
                        operation.as_strategy(
                            generation_mode=mode, path_parameters={"job_id": own_job["id"]}
                        ),
                    )
                try:
                    fuzz(label, strategy, EXAMPLES_PER_MODE)
                except Unsatisfiable:
                    # Nothing to break: an operation without parameters or body has no invalid
                    # request in the document's terms (wrong methods are tested elsewhere).
                    assert mode == GenerationMode.NEGATIVE, f"{label}: no valid request to send"
                    tally.nothing_to_break.append(label)
            positive = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
            fuzz(label, tainted(operation, positive), TAINTED_EXAMPLES, bad_text=True)
            if label == "POST /api/v1/jobs":
                bodies = submissions(catalog).map(functools.partial(json_case, operation))
                fuzz(label, bodies, SUBMISSIONS, raw_json=True)
        node = stack.admin.http.get("/api/v1/nodes").json()["nodes"][0]["name"]
        for path, methods in schema.raw_schema["paths"].items():
            url = (
                path.replace("{job_id}", str(own_job["id"]))
                .replace("{name}", node)
                .replace("{sha256}", "0" * 64)
                .replace("{path}", "checkpoints/model.pt")
            )
            # Any other id (an experiment's): the method is refused before the view looks the
            # object up, so a number that names nothing still reaches the 405.
            url = re.sub(r"\{\w+_id\}", "1", url)
            assert "{" not in url, f"{path}: fill in its path parameter to test wrong methods"
            allowed = {method.upper() for method in methods}
            for method in sorted(METHODS - allowed):
                check_wrong_method(method, path, url, allowed)
    finally:
        pytestconfig.stash.setdefault(FUZZ_SUMMARY, []).extend(summary(tally, len(operations)))
    # Every operation the document declares was fuzzed (an endpoint added later is too).
    declared = {
        (method.upper(), path)
        for path, methods in schema.raw_schema["paths"].items()
        for method in methods
        if method.upper() in METHODS
    }
    assert {(o.method.upper(), o.path) for o in operations} == declared
    assert all(tally.sent[f"{o.method.upper()} {o.path}"] > 0 for o in operations)
    assert tally.accepted_jobs > 0, "no request got as far as launching a job"


def summary(tally: Tally, operations: int) -> list[str]:
    total = sum(tally.sent.values())
    per_operation = []
    for label, count in sorted(tally.sent.items()):
        note = "  (no invalid request possible)" if label in tally.nothing_to_break else ""
        if label == "POST /api/v1/jobs":
            note = f"  (with {SUBMISSIONS} bodies made of the catalog's names)"
        per_operation.append(f"  {count:4d}  {label}{note}")
    return [
        f"{operations} operations, {total} requests (up to {EXAMPLES_PER_MODE} positive and "
        f"{EXAMPLES_PER_MODE} negative examples each, {tally.bad_text} in all with one string "
        f"that is not text: a lone surrogate, NUL, a bidi override...) and "
        f"{tally.wrong_methods} with a method the path does not take: {tally.server_errors} "
        f"server errors, {tally.outside_schema} answers outside the schema; "
        f"{tally.refused_unchanged} refused requests, each of which changed nothing; "
        f"{tally.accepted_jobs} jobs accepted, each cancelled at once",
        *per_operation,
    ]
