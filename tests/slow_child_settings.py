"""The test project's settings, slow to read: a child process started with them takes
``START_SECONDS`` longer to set up, longer than ``demo.sleep_process``'s 1 s timeout."""

import time

from testproject.settings import *  # noqa: F403

START_SECONDS = 2.0

time.sleep(START_SECONDS)
