from tests.unit.helpers import sent_tasks

__all__ = ["sent_tasks"]
