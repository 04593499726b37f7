"""gpuopt: cheapest-allowed GPU capacity on AWS and GCP."""

__version__ = "0.1.0"
