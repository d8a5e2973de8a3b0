"""What the New-job form shows before Launch: the request's totals, price and formula, what the
quota has left, where it goes over, what no node could hold, and the count of workers that
fits; the instances' names and, for a parameter-server job, what its batch size means. Each
figure comes from the function that admission applies on Launch (totals, quota, scheduling,
submission), so the preview and the refusal cannot disagree, and the page computes none."""

from dataclasses import dataclass, field, replace

from django.contrib.auth.models import User

from jobs.models import PLATFORM_ROLES, Framework, FrameworkImage, KVStoreMode, batch_size_in
from jobs.services import quota, submission
from jobs.services.batching import batch_note, mode_note
from jobs.services.scheduler import scheduling
from jobs.services.totals import RESOURCES, RoleRequest, compute_totals, formula_text
from workers import contract
from workers.contract import tag_of


@dataclass(frozen=True)
class Preview:
    need: dict[str, int]  # per quota resource, "jobs" included
    left: dict[str, int] | None  # None: no quota applies to the user
    price_per_hour: str
    formula: str
    over: list[str] = field(default_factory=list)  # the refusal's words, one per excess
    never: list[str] = field(default_factory=list)  # what the nodes could never hold
    fits_with: str | None = None
    instances: list[str] = field(default_factory=list)  # "[master]", "[worker-1]", "…", …
    notes: str | None = None  # a parameter-server job's: the uncharged scheduler, the batch

    def as_dict(self) -> dict[str, object]:
        return {
            "need": self.need,
            "left": self.left,
            "price_per_hour": self.price_per_hour,
            "formula": self.formula,
            "over": self.over,
            "never": self.never,
            "fits_with": self.fits_with,
            "instances": self.instances,
            "notes": self.notes,
        }


# How many instances of a role the preview names before it elides the rest ("…").
NAMED_INSTANCES = 3


def instance_tags(roles: list[RoleRequest], kvstore: bool) -> list[str]:
    """The log tags the job's instances will have, the platform's scheduler first."""
    shown = [f"[{tag_of(role, 0)}]" for role in PLATFORM_ROLES] if kvstore else []
    for role in roles:
        first = contract.first_index(role.role, kvstore)
        indices = range(first, first + role.instances)
        shown += [f"[{tag_of(role.role, i)}]" for i in indices[:NAMED_INSTANCES]]
        if role.instances > NAMED_INSTANCES:
            shown += ["…", f"[{tag_of(role.role, indices[-1])}]"]
    return shown


def _ps_notes(roles: list[RoleRequest], mode: str, args: list[str]) -> str:
    workers = sum(r.instances for r in roles if r.role == "worker")
    return " ".join(
        part
        for part in (
            "The scheduler (1 instance) is not charged: it only coordinates, beside server-0.",
            batch_note(mode, workers, batch_size_in(args)),
            mode_note(mode),
        )
        if part
    )


def preview(
    user: User,
    image: FrameworkImage,
    roles: list[RoleRequest],
    kvstore_mode: str = "",
    args: list[str] | None = None,
    one_instance_per_node: bool = False,
) -> Preview:
    """Admission's answer to these roles now, without writing anything or locking a quota."""
    kvstore = image.framework == Framework.KVSTORE
    totals = compute_totals(roles)
    need = {r: totals.as_dict()[r] for r in RESOURCES} | {"jobs": 1}
    never = scheduling.why_never_placeable(roles, one_instance_per_node)
    shown = Preview(
        need=need,
        left=None,
        price_per_hour=str(totals.price_per_hour),
        formula=formula_text(totals),
        never=list(never.values()),
        instances=instance_tags(roles, kvstore),
        notes=_ps_notes(roles, kvstore_mode or KVStoreMode.DIST_SYNC, args or [])
        if kvstore
        else None,
    )
    try:
        scopes = quota.scopes_for(user)
    except quota.NoQuota as exc:
        return replace(shown, over=[str(exc)])
    over = quota.excesses(scopes, totals)
    advice = submission.fits_advice(
        roles, image.framework, scopes, over, never, one_instance_per_node=one_instance_per_node
    )
    return replace(
        shown,
        left=quota.effective_left(scopes),
        over=[e.message for e in over],
        fits_with=advice.message if advice else None,
    )
