"""Neutral helpers any package may import; they import nothing of gpuopt beyond this package."""
