"""Date formats for the pages Django renders itself (the admin): the console's one way of writing
a time, `2026-11-25 12:23:38`, instead of the locale's `Nov. 25, 2026, 12:23 p.m.`."""
