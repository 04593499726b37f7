"""For the GCP adapter tests: the recorded responses the fake serves (tests/data/gcp) and
Cloud Billing Catalog SKUs in the wire format, to add to them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.gcp_fake import COMPUTE_SERVICE_ID

DATA = Path(__file__).parent.parent / "data" / "gcp"


def wire_sku(
    sku_id: str, description: str, usd: float, *, group: str, usage: str, unit: str = "h"
) -> dict[str, Any]:
    """One `services.skus.list` entry as the Cloud Billing Catalog sends it (us-central1)."""
    units = int(usd)
    return {
        "name": f"services/{COMPUTE_SERVICE_ID}/skus/{sku_id}",
        "skuId": sku_id,
        "description": description,
        "category": {
            "serviceDisplayName": "Compute Engine",
            "resourceFamily": "Compute",
            "resourceGroup": group,
            "usageType": usage,
        },
        "serviceRegions": ["us-central1"],
        "pricingInfo": [
            {
                "summary": "",
                "pricingExpression": {
                    "usageUnit": unit,
                    "displayQuantity": 1,
                    "tieredRates": [
                        {
                            "startUsageAmount": 0,
                            "unitPrice": {
                                "currencyCode": "USD",
                                "units": str(units),
                                "nanos": round((usd - units) * 1e9),
                            },
                        }
                    ],
                    "baseUnit": "s",
                    "baseUnitConversionFactor": 3600,
                },
                "currencyConversionRate": 1,
                "effectiveTime": "2026-04-23T07:14:07.412Z",
            }
        ],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "REGIONAL", "regions": ["us-central1"]},
    }


# The recorded catalog already holds the 1-year A2 core ($0.019915) and A100 ($1.848362)
# commitment SKUs of us-central1, but no 1-year A2 RAM one; these complete both terms. They
# are test figures, not quoted prices: the 1-year RAM 37% under on-demand ($0.004237), as
# REFERENCE-ROUND2 §4 computes for a2-highgpu-1g; the 3-year core and RAM 55% under, the
# A100 about 65% under.
A2_COMMITMENT_SKUS = [
    wire_sku(
        "C0A2-0001-0001",
        "Commitment v1: A2 Ram in Americas for 1 Year",
        0.002669,
        group="RAM",
        usage="Commit1Yr",
        unit="GiBy.h",
    ),
    wire_sku(
        "C0A2-0003-0001",
        "Commitment v1: A2 Cpu in Americas for 3 Year",
        0.014225,
        group="CPU",
        usage="Commit3Yr",
    ),
    wire_sku(
        "C0A2-0003-0002",
        "Commitment v1: A2 Ram in Americas for 3 Year",
        0.001907,
        group="RAM",
        usage="Commit3Yr",
        unit="GiBy.h",
    ),
    wire_sku(
        "C0A2-0003-0003",
        "Commitment v1: Nvidia Tesla A100 GPU in Americas for 3 Year",
        1.0285,
        group="GPU",
        usage="Commit3Yr",
    ),
]
