"""gpuopt's test suite. A package, so that its shared helpers import as `tests.helpers`."""
