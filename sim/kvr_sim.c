/* kvr_sim.c - kvr-sim: the policy lab as a standalone program (kvr/sim.h, docs/SIM.md).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/sim.h"

int main(int argc, char **argv)
{
    return kvr_sim_main(argc, argv);
}
