"""`python -m fitjax.cli ...` is the `fitjax` console command."""

from fitjax.cli._main import main

main()
