"""fedshift on Flower (``flwr`` 1.41, Message API): the same algorithms, across processes.

- :mod:`.wire`: payloads <-> Flower records (every named record is its own ``ArrayRecord``);
- :mod:`.node`: the ClientApp (one client per SuperNode, state kept in the node's context);
- :mod:`.server`: the ServerApp's round loop (:class:`FlowerServer`);
- :mod:`.simulate`: ``fedshift flower simulate`` (Ray or in-process);
- :mod:`.inprocess`: a Grid delivering messages in this process (tests, debugging);
- :mod:`.apps`: the ``server_app`` / ``client_app`` objects a Flower App (FAB) names;
- :mod:`.deploy`: the Flower App, certificates and keys, ``fedshift flower submit``.
"""

import importlib.util

from fedshift.core.errors import FedshiftError

if importlib.util.find_spec("flwr") is None:  # before any submodule imports it
    raise FedshiftError(
        "`fedshift flower` needs Flower (the Python package flwr), which is not installed: "
        "pip install 'fedshift[flower]'"
    )
