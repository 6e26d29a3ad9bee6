"""Worker that writes to both streams. argv: <lines> <width> [partial]
Each stdout line is "<rank>:<n>:" followed by width 'x's; stderr gets "err <rank>"."""
import os
import sys

lines = int(sys.argv[1])
width = int(sys.argv[2])
rank = os.environ["LOCAL_RANK"]
body = "x" * width
for n in range(lines):
    sys.stdout.write(f"{rank}:{n}:{body}\n")
sys.stdout.flush()
sys.stderr.write(f"err {rank}\n")
sys.stderr.write("loss=0.5 epoch=1\n")
if "partial" in sys.argv[3:]:
    sys.stdout.write(f"tail-without-newline-{rank}")
sys.stdout.flush()
