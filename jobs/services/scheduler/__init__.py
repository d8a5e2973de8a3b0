"""The scheduler: one pass over the waiting jobs (scheduling) and its policies: the queue's
order, fair share, borrowing and reclaim, preemption, backfill, and why a job waits. It
writes through the lifecycle and never imports the read model."""
