"""The node side of Trainyard: agent, launchers, log shipping and example trainers.

Nothing in this package imports Django: a GPU host joins a cluster with Redis access and the
trainer's code only, never database credentials.
"""
