"""fedclust: vectorized multi-process trainer for clustered federated learning."""

__version__ = "0.1.0"


def load_client_model(path, client: int, best: bool = False, trust_code: bool = False):
    """Client ``client``'s model as a ready ``nn.Module`` from a run directory or a ``fedclust export``;
    ``best``: its model at its best-validation round (``data.validation``); ``trust_code``: allow importing the
    user model's file (and a run's plugins) that the run or export names, which is never done otherwise
    (:func:`fedclust.export.load_client_model`)."""
    from fedclust.export import load_client_model as load

    return load(path, client, best, trust_code)
