# Sourced by .ci/run from the repository root. GPUOPT_SHARED_DIR names the folder with the
# shared AWS/GCP price rows (data/catalog) that the tests marked `catalog` compare gpuopt's
# tables with; without it they skip. Set it to ../shared, as an absolute path, when that
# folder exists and the variable is not set already.
if [ -z "${GPUOPT_SHARED_DIR:-}" ] && [ -d ../shared ]; then
  GPUOPT_SHARED_DIR=$(cd ../shared && pwd -P)
  export GPUOPT_SHARED_DIR
fi
