. benchmarks/gpu_steps.sh
export IDLE=0.8 SECONDS_WINDOW=0.6
V="default;block_n=2 prefetch=1;block_n=1 prefetch=1;block_n=2 prefetch=1 num_warps=1;block_n=2 prefetch=1 block_kw=128;block_n=2 prefetch=1 num_stages=6;block_n=2 prefetch=1 num_stages=3;block_n=2 prefetch=1 num_warps=4 block_kw=512"
FMTS=mxfp8_e4m3,int8_fp16,mxint8,nvfp4 VARIANTS="$V" step s8k 200 python benchmarks/exp_power.py 8192x8192
FMTS=mxfp8_e4m3,int8_fp16,nvfp4 VARIANTS="default;block_n=2 prefetch=1;block_n=1 prefetch=1" step l28 150 python benchmarks/exp_power.py 28672x8192
FMTS=mxfp8_e4m3,int8_fp16,nvfp4 VARIANTS="default;block_n=2 prefetch=1;block_n=1 prefetch=1" step w28 150 python benchmarks/exp_power.py 8192x28672
for f in s8k l28 w28; do grep -v Warning "$OUT/$f.log" | sed -n '/1 token/,$p'; done
