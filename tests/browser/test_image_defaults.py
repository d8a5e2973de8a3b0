"""The New-job form says what the chosen image sets for every trainer, and that the user's own
variables win over it."""

import pytest
from playwright.sync_api import Page, expect

from tests.conftest import RunningStack

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_the_form_lists_the_chosen_images_default_variables(
    page: Page, stack: RunningStack
) -> None:
    page.goto(f"{stack.url}/jobs/new/")
    page.select_option("#id_image", "pytorch:2.13-cpu")
    sets = page.locator("#field-env .image-env:visible")
    expect(sets).to_have_text(
        "This image sets: ACCELERATE_USE_CPU=true. Your own variables of the same name win."
    )
    page.select_option("#id_image", "kvstore-ps:2.13")  # it sets none
    expect(sets).to_have_count(0)
