"""``python -m course``: the course's command-line tools (see ``course.cli``)."""

import sys

from course.cli import main

sys.exit(main())
