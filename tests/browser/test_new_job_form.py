"""The New-job form helps before Launch: health rules built from the server's kinds and checked
by its parser as they are written, the advice on how many workers fit as the counts change,
and packages that could never run offered disabled, with why."""

import json
import re

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.conftest import keep_screenshot, user_page
from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_a_health_rule_built_in_the_editor_is_checked_by_the_server_and_launched(
    browser: Browser, stack: RunningStack
) -> None:
    fern = stack.create_user(
        "fern", "fern-password-1", quota={"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 2}
    )
    with user_page(browser, stack, "fern", "fern-password-1") as page:
        page.goto(f"{stack.url}/jobs/new/")
        page.fill("#id_name", "watched")
        # Named, not left to the default (the first PyTorch image by name): tests beside
        # this one add images to the shared stack.
        page.select_option("#id_image", "pytorch:2.13-cpu")
        page.select_option("#id_script", "__path__")
        page.fill("#id_script_path", "markup.py")
        page.fill("#id_instances", "1")
        expect(page.locator("#rules-note")).to_contain_text("its image's rules")

        page.click("#add-rule")
        rule = page.locator("#rule-list li.rule").first
        # The kinds and actions offered are the server's.
        expect(rule.locator("select[data-role=kind] option")).to_have_text(
            ["non-finite", "no-progress", "log-pattern", "throughput-drop", "gpu-idle"]
        )
        rule.locator("select[data-role=kind]").select_option("no-progress")
        # The server's parser says what is missing, under the rule.
        rule = page.locator("#rule-list li.rule").first
        expect(rule.locator(".rule-verdict")).to_have_text(
            "rule 1: a no-progress rule needs 'factor', 'minutes' or both, "
            'e.g. {"factor": 10, "minutes": 30}'
        )
        rule.locator("select[data-role=kind]").select_option("log-pattern")
        rule = page.locator("#rule-list li.rule").first
        rule.locator("input[data-param=pattern]").fill("x*")
        expect(rule.locator(".rule-verdict")).to_have_text(
            "rule 1: 'pattern' matches an empty line, so it would match every line"
        )
        rule.locator("input[data-param=pattern]").fill("not bold")
        rule.locator("select[data-role=action]").select_option("warn")
        expect(rule.locator(".rule-verdict")).to_be_hidden()
        expect(rule.locator("input[data-role=name]")).to_have_attribute(
            "placeholder", "log matches 'not bold'"
        )

        # The JSON on demand is exactly what Launch sends.
        page.click("#rules-json summary")
        box = page.locator("#id_health_rules")
        expect(box).to_be_visible()
        assert json.loads(box.input_value()) == [
            {"kind": "log-pattern", "action": "warn", "pattern": "not bold", "stream": "any"}
        ]
        # Typed there, the rows follow what the server read.
        box.fill(
            '[{"kind": "log-pattern", "action": "warn", "pattern": "not bold"},'
            ' {"kind": "non-finite", "action": "stop"}]'
        )
        expect(page.locator("#rule-list li.rule")).to_have_count(2)
        second = page.locator("#rule-list li.rule").nth(1)
        expect(second.locator("select[data-role=kind]")).to_have_value("non-finite")
        expect(second.locator("input[data-param=metric]")).to_have_attribute("placeholder", "loss")
        keep_screenshot(page, "new-job-health-rules")

        # Leaving the box changes the form, whose preview then redraws the page above Launch
        # (the button moved 456 px down between mouse down and up, so the click was lost):
        # a known fault of the form, noted in the closing note; the test lets it settle first.
        box.blur()
        page.wait_for_load_state("networkidle")
        page.click("#launch")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        rules = page.locator("#health-rules .health-rule")
        expect(rules).to_have_text(["log matches 'not bold' → warn", "loss is not finite → stop"])
        fern.wait_finished(job_id)
    assert fern.job(job_id)["health_rules"] == [
        {"kind": "log-pattern", "action": "warn", "pattern": "not bold", "stream": "any"},
        {"kind": "non-finite", "action": "stop", "metric": "loss"},
    ]


def test_the_workers_that_fit_are_advised_before_launch(
    browser: Browser, stack: RunningStack
) -> None:
    stack.create_user(
        "gwen", "gwen-password-1", quota={"cpu": 2, "gpus": 0, "memory_gb": 32, "running_jobs": 2}
    )
    with user_page(browser, stack, "gwen", "gwen-password-1") as page:
        page.goto(f"{stack.url}/jobs/new/")
        page.select_option("#id_package", "cpu-1")
        page.fill("#id_instances", "3")
        expect(page.locator("#fits-with")).to_have_text(
            "It fits with 1 worker (2 instances in all)."
        )
        expect(page.locator("#advice")).to_contain_text(
            "Over quota on CPU cores: this job needs 3, you have 2 left of 2 (over by 1)."
        )
        expect(page.locator("tr[data-resource=cpu]")).to_have_class(re.compile("over"))
        keep_screenshot(page, "new-job-fits-with")
        page.fill("#id_instances", "2")
        expect(page.locator("#advice")).to_be_hidden()
        expect(page.locator("#fits-with")).to_have_count(0)
        expect(page.locator("tr[data-resource=cpu] .need")).to_have_text("2")
        expect(page.locator("tr[data-resource=cpu]")).not_to_have_class(re.compile("over"))


def test_a_gpu_package_is_disabled_with_its_reason_on_a_cpu_only_stack(
    browser: Browser, stack: RunningStack
) -> None:
    # Quota enough for it: what stands in the way is the stack's nodes, which have no GPU.
    stack.create_user(
        "gpu-seeker",
        "gpu-seeker-password-1",
        quota={"cpu": 64, "gpus": 4, "memory_gb": 512, "running_jobs": 2},
    )
    with user_page(browser, stack, "gpu-seeker", "gpu-seeker-password-1") as page:
        page.goto(f"{stack.url}/jobs/new/")
        gpu = page.locator("#id_package option[value=worker-p100x2]")
        expect(gpu).to_be_disabled()
        expect(gpu).to_contain_text("unavailable: no node has a GPU")
        expect(gpu).to_have_attribute("title", "no node has a GPU")
        expect(page.locator("#id_package option[value=cpu-1]")).to_be_enabled()
