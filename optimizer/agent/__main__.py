"""`python -m optimizer.agent` runs the agent (optimizer/agent/start.py)."""

import sys

from optimizer.agent.start import run_agent

sys.exit(run_agent())
