"""Federated algorithms: peer-to-peer baselines, PANM, PENS and the centralized rivals."""
