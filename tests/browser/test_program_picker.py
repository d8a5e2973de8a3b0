"""The New-job form's program picker in a browser: what each choice asks for and says, and a
job launched from code the user uploaded."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import user_page
from tests.conftest import RunningStack, StackClient

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "pia-password-1"


@pytest.fixture(scope="module")
def pia(stack: RunningStack) -> StackClient:
    return stack.create_user(
        "pia", PASSWORD, quota={"cpu": 8, "gpus": 0, "memory_gb": 32, "running_jobs": 4}
    )


@pytest.fixture
def pia_page(browser: Browser, stack: RunningStack, pia: StackClient) -> Iterator[Page]:
    with user_page(browser, stack, "pia", PASSWORD) as page:
        yield page


def test_each_choice_shows_what_it_needs(pia_page: Page, stack: RunningStack) -> None:
    page = pia_page
    page.goto(f"{stack.url}/jobs/new/")
    page.select_option("#id_script", "synthetic-ddp")
    expect(page.locator("[data-program='synthetic-ddp']")).to_contain_text("--width N")
    expect(page.locator("[data-program='digits-ddp']")).to_be_hidden()
    expect(page.locator("#field-script_path")).to_be_hidden()

    page.select_option("#id_script", "fail.py")  # listed from the code root
    expect(page.locator("[data-program='code-root']")).to_be_visible()
    expect(page.locator("#field-script_path")).to_be_hidden()
    # Another image keeps a script of the user's: only examples follow the framework.
    page.select_option("#id_image", "kvstore-ps:2.13")
    expect(page.locator("#id_script")).to_have_value("fail.py")

    page.select_option("#id_script", "__path__")
    expect(page.locator("#field-script_path")).to_be_visible()
    suggested = page.locator("#code-root-scripts option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert "markup.py" in suggested


def test_a_job_runs_a_script_from_uploaded_code(
    pia_page: Page, stack: RunningStack, pia: StackClient, tmp_path: Path
) -> None:
    code = tmp_path / "project"
    (code / "tools").mkdir(parents=True)
    (code / "train.py").write_text("print('hello from the upload')\n")
    (code / "tools" / "eval.py").write_text("print('evaluating')\n")
    sha = pia.upload(code, "my project")

    page = pia_page
    page.goto(f"{stack.url}/jobs/new/")
    page.fill("#id_name", "from my upload")
    expect(page.locator("#id_script optgroup[label='Your uploaded code'] option")).to_have_text(
        re.compile(rf"^my project · {sha[:12]} · 2 files")
    )
    page.select_option("#id_script", f"snapshot:{sha}")
    expect(page.locator("#field-snapshot_script")).to_be_visible()
    expect(page.locator("#id_snapshot_script")).to_have_value("train.py")
    files = page.locator("#snapshot-scripts option").evaluate_all("os => os.map(o => o.value)")
    assert files == ["tools/eval.py", "train.py"]
    expect(page.locator("[data-program='snapshot']")).to_be_visible()
    page.fill("#id_instances", "1")
    page.click("#launch")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator(".summary")).to_contain_text(f"from code snapshot {sha[:12]}")
    expect(page.locator("#log")).to_contain_text("hello from the upload")
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert pia.wait_finished(job_id)["program"] == {
        "script": "train.py",
        "args": [],
        "snapshot": sha,
    }
