/* The sift command line: one function per subcommand. Each returns the
 * process exit status (0 ok, 1 result below target, 2 usage or config error). */
#pragma once

int sift_cmd_version (int argc, char **argv);
int sift_cmd_policies (int argc, char **argv);
int sift_cmd_policies_new (int argc, char **argv);
int sift_cmd_config (int argc, char **argv);
int sift_cmd_needle (int argc, char **argv);
int sift_cmd_bench (int argc, char **argv);
int sift_cmd_model (int argc, char **argv);
int sift_cmd_generate (int argc, char **argv);

/* `sift bench` subcommands. */
int sift_bench_peak (int argc, char **argv);
int sift_bench_attention (int argc, char **argv);
int sift_bench_offload (int argc, char **argv);
int sift_bench_policy (int argc, char **argv);
int sift_bench_evict (int argc, char **argv);
