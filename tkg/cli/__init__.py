"""The `tkg` command (its entry point is `tkg.cli:app`): the application and its errors in
tkg.cli.app, the commands that build the graph in tkg.cli.building, the ones that read it in
tkg.cli.answers, and the explorer page in tkg.cli.exploring."""

from tkg.cli import answers, building, exploring  # noqa: F401 - registers their commands on the app
from tkg.cli.app import app

__all__ = ["app"]
