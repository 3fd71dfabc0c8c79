"""Who may talk to the e2e apiserver: static bearer tokens and one kubeconfig per user.

A token file is the simplest authentication a test cluster can have, and it
needs no client certificates. KCM and the scheduler get the user names that the
apiserver's bootstrap RBAC policy grants their permissions to, as under kubeadm,
so RBAC is exercised for them; the test admin and kwok are cluster admins.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml

ADMIN = "admin"
CONTROLLER_MANAGER = "system:kube-controller-manager"
SCHEDULER = "system:kube-scheduler"
KWOK = "kwok"
# The real node's components (e2e/real_node.py), as kubeadm names them: the Node authorizer and
# the bootstrap ClusterRoles (system:node, system:node-proxier) grant what they need. CoreDNS
# gets the ClusterRole real_node.py creates for it.
NODE_PREFIX = "system:node:"
REAL_NODE = "mlsched-node-0"
KUBELET = NODE_PREFIX + REAL_NODE
KUBE_PROXY = "system:kube-proxy"
COREDNS = "coredns"

# user name -> groups
_USERS = {
    ADMIN: ["system:masters"],
    CONTROLLER_MANAGER: [],
    SCHEDULER: [],
    KWOK: ["system:masters"],
    KUBELET: ["system:nodes"],
    KUBE_PROXY: [],
    COREDNS: [],
}


class Credentials:
    def __init__(self, directory: Path, server_url: str, ca_cert: Path):
        self.directory = directory
        self.server_url = server_url
        self.ca_cert = ca_cert
        self.tokens = {user: secrets.token_hex(24) for user in _USERS}
        self.token_file = directory / "tokens.csv"
        # Format: token,user,uid,"group1,group2"
        self.token_file.write_text("".join(
            f'{self.tokens[user]},{user},{user},"{",".join(groups)}"\n'
            for user, groups in _USERS.items()))

    def kubeconfig(self, user: str) -> Path:
        """Writes (or rewrites) the kubeconfig of `user` and returns its path."""
        path = self.directory / f"{user.removeprefix('system:').replace(':', '-')}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.server_url,
                "certificate-authority": str(self.ca_cert)}}],
            "users": [{"name": user, "user": {"token": self.tokens[user]}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }))
        return path
