"""`pearl-manage`: the repository's `manage.py` for an installed PEARL (the wheel carries no manage.py), e.g.
`pearl-manage check`, `pearl-manage migrate`, `pearl-manage launch`."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
