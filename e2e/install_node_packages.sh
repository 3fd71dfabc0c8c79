#!/usr/bin/env bash
# The Debian packages the real node (e2e/real_node.py) and its images (e2e/build_images.sh) run
# on, installed when one is missing: containerd and runc run the containers, the CNI plugins
# give pods their addresses, iptables carries kube-proxy's Services, buildah and mmdebstrap
# build the images. Needs root and Debian's mirrors; a no-op when all are there.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables iproute2 buildah mmdebstrap)
missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" != 0 ]]; then
  echo "install_node_packages: missing ${missing[*]}; as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "install_node_packages: apt-get install ${missing[*]}" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
