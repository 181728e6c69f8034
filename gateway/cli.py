"""The `cachegate` command: serve, sim-backend, simulate, loadtest, demo."""

from __future__ import annotations

import typer

from backends.sim.cli import sim_backend
from loadtest.cli import demo, loadtest, simulate

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cachegate: an OpenAI-compatible gateway with admission control for SGLang.")

app.command("sim-backend")(sim_backend)
app.command("simulate")(simulate)
app.command("loadtest")(loadtest)
app.command("demo")(demo)


@app.command("serve")
def serve() -> None:
    """Run the gateway."""
    raise typer.Exit(code=2)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
