from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        # The read model, registered with the writers' events once: they tell clients a job
        # changed without importing what builds its payload.
        from jobs.services.lifecycle import events
        from jobs.services.views import presenters

        events.use_payloads(presenters.states_of)
