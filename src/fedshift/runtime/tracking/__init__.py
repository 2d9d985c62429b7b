"""A run's trackers (hooks of its round loop): the interface, ``metrics.csv``, TensorBoard
and the ``provenance`` block (:mod:`.trackers`), Weights & Biases and MLflow
(:mod:`.services`), and the registry of the ``track`` key's names (:mod:`.registry`)."""
