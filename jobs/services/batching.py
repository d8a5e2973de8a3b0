"""What a parameter-server job's kvstore mode and batch size mean, in the sentences that the
New-job form's preview and the job page both show: the size a user gives is per worker, so the
global batch is workers × that size, except under dist_async, where every push updates at once."""

from jobs.models import KVStoreMode


def batch_note(mode: str, workers: int, per_worker: int | None) -> str:
    if mode == KVStoreMode.DIST_ASYNC:
        given = f" ({per_worker})" if per_worker else ""
        return (
            f"Batch size means per worker{given}; dist_async: each push updates the parameters "
            "at once, so there is no global batch and workers never wait for each other."
        )
    size = f"{per_worker} = {workers * per_worker}" if per_worker else "the per-worker batch"
    return f"Batch size means per worker: global batch = {workers} × {size}."


def mode_note(mode: str) -> str:
    """What a mode does differently here; "" for none."""
    if mode == KVStoreMode.DIST_DEVICE_SYNC:
        return "On CPU, dist_device_sync behaves exactly like dist_sync."
    return ""
