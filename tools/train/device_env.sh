# Sourced by the device_*.sh scripts after their arguments: the shell
# settings and inputs they share, and the machine's record at the head of
# the log ($OUT/$LOG, default log.txt).  T (default: the script's folder),
# KJV (kjv.txt.gz) and TOK (models/tokenizer.json) name the inputs.
set -o pipefail
: "${OUT:?}"
export PYTHONUNBUFFERED=1
T=${T:-$(dirname "$0")}
KJV=${KJV:-kjv.txt.gz}
TOK=${TOK:-models/tokenizer.json}
log=$OUT/${LOG:-log.txt}
nvidia-smi -L | tee -a "$log"
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' | tee -a "$log"
