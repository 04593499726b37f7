"""`python -m optimizer.cli …` runs `gpuopt …` (the agent's bootstrap and the tests use it)."""

from optimizer.cli import main

main()
