#!/usr/bin/env bash
# Everything `make e2e` needs before its tests, from a cold cache in the least wall time:
#
#   1. the real node's Debian packages (install_node_packages.sh; also what builds the images);
#   2. the images (build_images.sh) in the background, while
#   3. the Go programs are compiled one after another in the foreground: the control plane and
#      node (build_control_plane.sh), Argo CD's health assessment (build_argocd.sh) and
#      promtool (build_prometheus_tools.sh).
#
# Why in parallel: the Go builds keep both cores busy on their own (`go build -p 2`), so two of
# them at once would gain nothing; the image build spends much of its time waiting on Debian's
# mirror and PyPI (mmdebstrap, torch's wheels) and writing layers, time the compiler can use.
# On a warm cache every step returns at once.
#
# Each step logs with its own tag ([build_images], [build_control_plane], ...), so the
# interleaved lines stay readable. A failure of either side fails the whole, after both ended.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
START=$SECONDS

bash "$HERE/install_node_packages.sh" || exit 1

# Only the directory each script prints on stdout; it is not needed here.
bash "$HERE/build_images.sh" >/dev/null &
images_pid=$!

go_rc=0
for script in build_control_plane.sh build_argocd.sh build_prometheus_tools.sh; do
  if ! bash "$HERE/$script" >/dev/null; then
    go_rc=1
    echo "[build_all] $script failed (its log is above)" >&2
    break
  fi
done
echo "[build_all] Go programs ready after $((SECONDS - START)) s; waiting for the images" >&2

images_rc=0
wait "$images_pid" || images_rc=$?
if [[ $images_rc -ne 0 ]]; then
  echo "[build_all] build_images.sh failed with exit $images_rc (its log is above)" >&2
fi
echo "[build_all] done in $((SECONDS - START)) s" >&2
[[ $go_rc -eq 0 && $images_rc -eq 0 ]]
