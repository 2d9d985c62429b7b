"""pFedHN (Shamsian, Navon, Fetaya & Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021): a server hypernetwork generates every client's model
(Algorithm 1); pFedHN-PC keeps a personal classifier head on each client (Sec. 3).

* :mod:`.params`: the config keys;
* :mod:`.hypernet`: the hypernetwork h(v_i; phi);
* :mod:`.algorithm`: the server update through delta theta and the client's local steps.

docs/METHODS.md lists the defaults taken from the released code and the departures.
"""

from __future__ import annotations

from fedshift.algorithms.pfedhn.algorithm import PFedHN
from fedshift.algorithms.pfedhn.hypernet import HyperNetwork
from fedshift.algorithms.pfedhn.params import PFedHNParams

__all__ = ["HyperNetwork", "PFedHN", "PFedHNParams"]
