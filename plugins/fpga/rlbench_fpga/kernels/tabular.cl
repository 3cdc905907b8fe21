// Tabular Q-learning / SARSA, exact and in order: one single work-item walks the transitions, each
// update seen by the next (the FPGA pipelines the loop; the Q-table sits in device memory).
// float64 like the reference; no contraction into fma, so results match the host bit for bit.
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#pragma OPENCL FP_CONTRACT OFF

#ifdef cl_intel_channels
#define TASK __attribute__((max_global_work_dim(0))) __attribute__((reqd_work_group_size(1, 1, 1)))
#else
#define TASK __attribute__((reqd_work_group_size(1, 1, 1)))
#endif

// staging: [n rewards as double][obs, action, next_obs, next_action, done: n ints each]
TASK __kernel void td_update(__global double *restrict q, __global const double *restrict staging, int n,
                             int n_actions, int sarsa, double alpha, double gamma, int sweeps) {
    __global const int *ids = (__global const int *)(staging + n);
    __global const int *obs = ids, *action = ids + n, *next_obs = ids + 2 * n;
    __global const int *next_action = ids + 3 * n, *done = ids + 4 * n;
    for (int sweep = 0; sweep < sweeps; sweep++) {
        for (int i = 0; i < n; i++) {
            double target = staging[i];
            if (!done[i]) {
                __global const double *row = q + (long)next_obs[i] * n_actions;
                double bootstrap;
                if (sarsa) {
                    bootstrap = row[next_action[i]];
                } else {
                    bootstrap = row[0];
                    for (int a = 1; a < n_actions; a++) bootstrap = fmax(bootstrap, row[a]);
                }
                target = target + gamma * bootstrap;
            }
            __global double *cell = q + (long)obs[i] * n_actions + action[i];
            *cell = *cell + alpha * (target - *cell);
        }
    }
}
