"""The order waiting jobs are considered in, before fair share: higher priority first, then
first come, first served (jobs.services.scheduler.queue adds the reserved lenders ahead and fair
share between priority and submission time). A requeued job (restarted, preempted) keeps its
submission time, so its place."""

# As a queryset's order_by, for the scheduler's query (and its index, Job's job_queue_order).
ORDER_BY = ("-priority", "created", "id")
