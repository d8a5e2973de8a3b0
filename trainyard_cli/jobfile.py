"""A job request from a job file (YAML) and the command's flags.

A job file holds exactly the body of `POST /api/v1/jobs` (name, image, program, roles,
kvstore, priority, restart, one_instance_per_node, time_limit, health_rules, metrics, env,
project, tags, note), plus one key of the CLI's own:

    code: ./src      # the folder to upload as the code snapshot, relative to the job file

and, for `trainyard search submit` only, a `search:` section (trainyard_cli/search_section.py)
that makes the file an experiment: the rest of it is the template of its trials.

The console checks the request; this module only reads the file and applies the flags, so
that every refusal is the API's own message about the field.
"""

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainyard_cli.errors import BAD_INPUT, CliError

CODE_KEY = "code"
SEARCH_KEY = "search"
NO_SEARCH = object()  # the file has no `search:` section (`search: null` is one, and wrong)


@dataclass
class Draft:
    body: dict[str, Any]
    code: Path | None  # from the job file's `code:`, resolved against the file's folder
    search: Any = NO_SEARCH  # the `search:` section as written, for `trainyard search submit`

    @property
    def is_experiment(self) -> bool:
        return self.search is not NO_SEARCH


def read(path: Path) -> Draft:
    """The job file's fields, or CliError (BAD_INPUT) with the line and column of the first
    thing it cannot take: bytes that are not UTF-8, YAML it cannot parse, text that is not text
    (a lone surrogate or NUL written as an escape), or aliases that expand too far. Everything
    is checked here, before anything is uploaded."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"Cannot read the job file {path}: {exc.strerror}.", BAD_INPUT) from None
    text = _decode(path, raw)
    data = _load(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise CliError(f"{path} must be a mapping of fields (name:, image:, ...).", BAD_INPUT)
    code = data.pop(CODE_KEY, None)
    if code is not None and not isinstance(code, str):
        raise CliError(f"{path}: code: must be a folder's path.", BAD_INPUT)
    search = data.pop(SEARCH_KEY, NO_SEARCH)
    return Draft(data, (path.parent / code).resolve() if code else None, search)


# What a job file may expand to, counting every value an alias stands for as often as it is
# used: far more than any job needs (its env, arguments and rules), and a bound on what the
# command then encodes and sends. PyYAML itself has no such limit: a "billion laughs" file of
# a few lines stands for 10^9 values, which json.dumps would try to write out.
MAX_VALUES = 100_000


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        column = len(raw[line_start : exc.start].decode("utf-8", "replace")) + 1
        raise CliError(
            f"{path} is not UTF-8 text {_where(line, column)}: byte 0x{raw[exc.start]:02x} "
            "cannot start or continue a character.",
            BAD_INPUT,
        ) from None


def _load(path: Path, text: str) -> Any:
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters at once
        node = loader.get_single_node()
        if node is None:
            return None
        _check_values(path, node)
        return loader.construct_document(node)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow in a file
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise CliError(
            f"{path} is not valid YAML {_where(line, column)}: "
            f"character U+{int(exc.character):04X} is not allowed ({exc.reason}).",
            BAD_INPUT,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" {_where(mark.line + 1, mark.column + 1)}" if mark else ""
        problem = exc.problem or exc.context or str(exc)
        raise CliError(f"{path} is not valid YAML{at}: {problem}.", BAD_INPUT) from None
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is not valid YAML: {exc}.", BAD_INPUT) from None
    except RecursionError:
        raise CliError(f"{path} is not valid YAML: it is nested too deeply.", BAD_INPUT) from None
    finally:
        if loader is not None:
            loader.dispose()


def _where(line: int, column: int) -> str:
    return f"(line {line}, column {column})"


def _check_values(path: Path, root: yaml.Node) -> None:
    """Every scalar must be text that JSON can carry, and the document must expand to at most
    MAX_VALUES values. Aliases are the same node object in PyYAML's graph, so each node's
    expanded size is computed once (post-order, without recursion): linear in the file."""
    expanded: dict[int, int] = {}
    visiting: set[int] = set()  # the nodes on the path from the root to the current one
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            size = 1 + sum(expanded[id(c)] for c in _children(node))
            if size > MAX_VALUES:
                raise _refusal(
                    path,
                    node,
                    f"this expands to more than {MAX_VALUES:,} values through its aliases "
                    "(*name); write the values out, or fewer of them",
                )
            expanded[id(node)] = size
            visiting.discard(id(node))
            continue
        if id(node) in expanded:
            continue
        if id(node) in visiting:
            raise _refusal(path, node, "a value that contains itself (through an alias)")
        if isinstance(node, yaml.ScalarNode):
            _check_text(path, node)
            expanded[id(node)] = 1
            continue
        visiting.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_text(path: Path, node: yaml.ScalarNode) -> None:
    bad = first_unusable_character(node.value)
    if bad is not None:
        raise _refusal(path, node, f"character U+{ord(bad):04X} is not text the console takes")


def first_unusable_character(text: str) -> str | None:
    """The first character that cannot travel as UTF-8 JSON or that no field should hold:
    a lone surrogate (YAML's "\\ud800" escape, or bytes that were not UTF-8 in an argument),
    NUL or another control character other than tab and line breaks."""
    for char in text:
        if "\ud800" <= char <= "\udfff" or (
            unicodedata.category(char) == "Cc" and char not in "\t\n\r"
        ):
            return char
    return None


def _refusal(path: Path, node: yaml.Node, why: str) -> CliError:
    mark = node.start_mark
    return CliError(
        f"{path} is not a usable job file {_where(mark.line + 1, mark.column + 1)}: {why}.",
        BAD_INPUT,
    )


def check_text(body: Any, field: str = "") -> None:
    """Every string of the request (the job file's, already checked, and the flags') is text
    the console can take; CliError naming the field otherwise. Run before any upload."""
    if isinstance(body, dict):
        for key, value in body.items():
            check_text(key, field)
            check_text(value, f"{field}.{key}" if field else str(key))
    elif isinstance(body, list):
        for index, value in enumerate(body):
            check_text(value, f"{field}[{index}]")
    elif isinstance(body, str):
        bad = first_unusable_character(body)
        if bad is not None:
            raise CliError(
                f"{field or 'a field name'}: character U+{ord(bad):04X} is not text the "
                "console takes.",
                BAD_INPUT,
            )


def parse_role(text: str) -> tuple[str, dict[str, Any]]:
    """--role ROLE=PACKAGE[:INSTANCES], e.g. worker=cpu-1:2 (one instance when not given), or
    an elastic range, worker=cpu-1:1-3 (torchrun's --nnodes=MIN:MAX, written with a dash)."""
    role, sep, rest = text.partition("=")
    package, _, count = rest.partition(":")
    if not sep or not role or not package:
        raise CliError(
            f"--role {text}: write ROLE=PACKAGE, ROLE=PACKAGE:INSTANCES or ROLE=PACKAGE:MIN-MAX.",
            BAD_INPUT,
        )
    fewest, dash, most = count.partition("-")
    try:
        if dash:
            return role, {"package": package, "instances": {"min": int(fewest), "max": int(most)}}
        instances = int(count) if count else 1
    except ValueError:
        raise CliError(
            f"--role {text}: {count!r} is not a whole number or a range MIN-MAX.", BAD_INPUT
        ) from None
    return role, {"package": package, "instances": instances}


def parse_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise CliError(f"--env {text}: write NAME=VALUE.", BAD_INPUT)
    return name, value


def parse_slurm(text: str) -> tuple[str, str | bool]:
    """--slurm qos=high → ("qos", "high"); --slurm exclusive → ("exclusive", True)."""
    key, equals, value = text.partition("=")
    key = key.strip()
    if key == "exclusive" and not equals:
        return key, True
    if not key or not equals:
        raise CliError(
            f"--slurm {text!r}: write NAME=VALUE (e.g. qos=high), or exclusive.", BAD_INPUT
        )
    return key, value.strip()


def apply_flags(
    body: dict[str, Any],
    *,
    name: str | None,
    image: str | None,
    script: str | None,
    args: list[str],
    roles: list[str],
    kvstore: str | None,
    env: list[str],
    restart_policy: str | None,
    max_restarts: int | None,
    exclude_failed_node: bool | None = None,
    args_on_resume: list[str] | None = None,
    data: list[str] | None = None,
    results: str | None = None,
    one_per_node: bool | None = None,
    time_limit: str | None = None,
    priority: str | None = None,
    pool: str | None = None,
    slurm: list[str] | None = None,
    project: str | None = None,
    tags: list[str] | None = None,
    container_image: str | None = None,
) -> dict[str, Any]:
    """The job file's body with the flags on top: a flag wins over the file's value (tags
    join the file's)."""
    body = dict(body)
    if project is not None:
        body["project"] = project
    if tags:
        filed = body.get("tags")
        body["tags"] = [*(filed if isinstance(filed, list) else []), *tags]
    if name is not None:
        body["name"] = name
    if image is not None:
        body["image"] = image
    if script is not None or args:
        program = _section(body, "program")
        if script is not None:
            program["script"] = script
        if args:
            program["args"] = list(args)
        body["program"] = program
    if roles:
        body["roles"] = {**_section(body, "roles"), **dict(parse_role(r) for r in roles)}
    if kvstore is not None:
        body["kvstore"] = kvstore
    if data:
        body["data"] = list(data)
    if results is not None:
        body["results"] = results
    if one_per_node is not None:
        body["one_instance_per_node"] = one_per_node
    if priority is not None:
        body["priority"] = priority
    if pool is not None:
        body["pool"] = pool
    if container_image is not None:
        body["container_image"] = container_image
    if slurm:
        body["slurm"] = {**_section(body, "slurm"), **dict(parse_slurm(o) for o in slurm)}
    if env:
        body["env"] = {**_section(body, "env"), **dict(parse_env(e) for e in env)}
    if (
        restart_policy is not None
        or max_restarts is not None
        or exclude_failed_node is not None
        or args_on_resume
    ):
        restart = _section(body, "restart")
        if restart_policy is not None:
            restart["policy"] = restart_policy
        if max_restarts is not None:
            restart["max_restarts"] = max_restarts
        if exclude_failed_node is not None:
            restart["exclude_failed_node"] = exclude_failed_node
        if args_on_resume:
            restart["args_on_resume"] = list(args_on_resume)
        body["restart"] = restart
    if time_limit is not None:
        # As typed: the console reads "2h", "90m" or seconds, and says what is wrong.
        text = time_limit.strip()
        body["time_limit"] = int(text) if text.isdigit() else text
    script_name = script_of(body)
    if "name" not in body and script_name:
        body["name"] = Path(script_name).stem  # a name the list can show; the user may set one
    return body


def _section(body: dict[str, Any], key: str) -> dict[str, Any]:
    """A copy of the mapping at `key` ({} when there is none), to change without touching the
    job file's own. Anything else there is dropped: the flag replaces it."""
    value = body.get(key)
    return dict(value) if isinstance(value, dict) else {}


def script_of(body: dict[str, Any]) -> str | None:
    """The program's script, when the body names one."""
    script = _section(body, "program").get("script")
    return script if isinstance(script, str) and script else None


def dump(body: dict[str, Any], what: str) -> str:
    """A job request as a job file that `read` takes back: the API's field order, text as
    YAML writes it (quoted where it would otherwise read as a number or a boolean)."""
    header = f"# {what}, as `trainyard submit` takes it; program.snapshot is its code.\n"
    return header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
