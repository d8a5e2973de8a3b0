"""`trainyard`: the command line client of Trainyard's API v1.

It needs nothing of the console's code: only HTTP, the job websocket and a token that the user
made on their API tokens page. `pip install 'trainyard[cli]'` installs it alone on a laptop.
"""
