// Note [Rank discovery] (comm/rank_discovery.h): launch environments as
// data, each as a launcher sets it, and the contradictions it refuses.
#include <gtest/gtest.h>

#include <string>

#include "comm/rank_discovery.h"
#include "core/error.h"

namespace mp {
namespace {

const Environment kTorchrun = {{"RANK", "1"},          {"WORLD_SIZE", "2"},         {"LOCAL_RANK", "1"},
                               {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
                               {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
const Environment kMpirun = {{"OMPI_COMM_WORLD_RANK", "3"},       {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                             {"PMIX_RANK", "3"}};
const Environment kSrun = {{"SLURM_PROCID", "2"},       {"SLURM_NTASKS", "4"},
                           {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "0"},
                           {"SLURM_NODEID", "1"},       {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
                           {"SLURM_STEP_ID", "0"},      {"SLURM_JOB_ID", "12345"},
                           {"SLURM_STEP_NODELIST", "node[07-08]"}};

Environment merged(Environment a, const Environment& b) {
  a.insert(b.begin(), b.end());
  return a;
}

RankArguments given(int rank, int world_size) {
  RankArguments a;
  a.rank = rank;
  a.world_size = world_size;
  return a;
}

// The ConfigError's message, or "" when discovery succeeded.
std::string refusal(const Environment& env, const RankArguments& args = {}) {
  try {
    discover_ranks(env, args);
  } catch (const ConfigError& e) {
    return e.message();
  }
  return "";
}

TEST(RankDiscovery, NothingIsAWorldOfOneOverMpi) {
  const Ranks r = discover_ranks({});
  EXPECT_EQ(r.source, RankSource::kNone);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.size, 1);
  EXPECT_TRUE(r.uses_mpi());
}

TEST(RankDiscovery, TorchrunUsesTheAgentsStore) {
  const Ranks r = discover_ranks(kTorchrun);
  EXPECT_EQ(r.source, RankSource::kTorchrun);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.size, 2);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_EQ(r.master_addr, "127.0.0.1");
  EXPECT_EQ(r.master_port, 29500);
  EXPECT_TRUE(r.agent_store);
  EXPECT_FALSE(r.uses_mpi());
  EXPECT_EQ(r.describe(),
            "ranks: torchrun (RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, MASTER_ADDR=127.0.0.1, "
            "MASTER_PORT=29500): rank 1 of 2, local 1 of 2");
  Environment own = kTorchrun;  // set by hand: rank 0 starts the store
  own.erase("TORCHELASTIC_USE_AGENT_STORE");
  EXPECT_FALSE(discover_ranks(own).agent_store);
}

TEST(RankDiscovery, MpirunIsMpi) {
  const Ranks r = discover_ranks(kMpirun);
  EXPECT_EQ(r.source, RankSource::kMpi);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_TRUE(r.uses_mpi());
  // srun --mpi=pmix: PMIx's rank, the step's size; PMIx alone: MPI will say.
  const Ranks pmix = discover_ranks(merged({{"PMIX_RANK", "2"}}, kSrun));
  EXPECT_EQ(pmix.source, RankSource::kMpi);
  EXPECT_EQ(pmix.rank, 2);
  EXPECT_EQ(pmix.size, 4);
  EXPECT_EQ(discover_ranks({{"PMIX_RANK", "2"}}).size, -1);
}

TEST(RankDiscovery, SrunMeetsOnTheFirstNodeOfTheStep) {
  const Ranks r = discover_ranks(kSrun);
  EXPECT_EQ(r.source, RankSource::kSlurm);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.size, 4);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_size, 2);
  EXPECT_EQ(r.master_addr, "node07");
  EXPECT_EQ(r.master_port, 20000 + 12345 % 20000);
  EXPECT_FALSE(r.agent_store);
  const Ranks given = discover_ranks(merged({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "4000"}}, kSrun));
  EXPECT_EQ(given.master_addr, "10.0.0.1");
  EXPECT_EQ(given.master_port, 4000);
  // A batch script's own shell (no step) is not a rank of anything.
  Environment batch = kSrun;
  batch.erase("SLURM_STEP_ID");
  EXPECT_EQ(discover_ranks(batch).source, RankSource::kNone);
}

TEST(RankDiscovery, TheFirstSourcePresentWins) {
  // torchrun inside an srun step (one torchrun per node): torchrun's.
  const Ranks r = discover_ranks(merged(kTorchrun, kSrun));
  EXPECT_EQ(r.source, RankSource::kTorchrun);
  EXPECT_EQ(r.rank, 1);
  // mpirun inside a Slurm allocation: MPI's, Slurm's step is its daemons'.
  EXPECT_EQ(discover_ranks(merged(kMpirun, kSrun)).source, RankSource::kMpi);
  // Explicit arguments over everything.
  const Ranks e = discover_ranks(kSrun, given(0, 1));
  EXPECT_EQ(e.source, RankSource::kExplicit);
  EXPECT_EQ(e.size, 1);
}

TEST(RankDiscovery, LightningsLauncherSaysWorldSizeAndLocalRank) {
  const Environment env = {{"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"NODE_RANK", "0"},
                           {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "4000"}};
  const Ranks r = discover_ranks(env);
  EXPECT_EQ(r.source, RankSource::kTorchrun);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.size, 2);
  Environment node1 = env;
  node1["NODE_RANK"] = "1";
  EXPECT_NE(refusal(node1).find("pass mp.init(rank=..., world_size=...)"), std::string::npos);
  EXPECT_EQ(discover_ranks(node1, given(3, 4)).rank, 3);
}

TEST(RankDiscovery, TorchrunOncePerNodeUnderMpirunAgrees) {
  // mpirun -np 2 torchrun --nproc-per-node 4: RANK 5 runs under MPI rank 1.
  const Environment env = {{"RANK", "5"},        {"WORLD_SIZE", "8"},        {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "a"},    {"MASTER_PORT", "1"},
                           {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  EXPECT_EQ(discover_ranks(env).rank, 5);
}

TEST(RankDiscovery, ContradictionsNameTheVariables) {
  Environment four = kTorchrun;
  four["WORLD_SIZE"] = "4";
  four["LOCAL_WORLD_SIZE"] = "4";
  const std::string m = refusal(merged(four, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  EXPECT_NE(m.find("contradictory launch environment"), std::string::npos) << m;
  EXPECT_NE(m.find("WORLD_SIZE=4"), std::string::npos) << m;
  EXPECT_NE(m.find("OMPI_COMM_WORLD_SIZE=2"), std::string::npos) << m;

  EXPECT_NE(refusal({{"OMPI_COMM_WORLD_RANK", "1"}, {"PMIX_RANK", "0"}}).find("OMPI_COMM_WORLD_RANK=1 but PMIX_RANK=0"),
            std::string::npos);
  EXPECT_NE(refusal({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}})
                .find("RANK=2 is not below WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(refusal({{"RANK", "0"}}).find("RANK is set but WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(refusal({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(refusal({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("set MASTER_ADDR and MASTER_PORT"),
            std::string::npos);
  EXPECT_NE(refusal(kTorchrun, given(0, 2)).find("explicit says rank 0 of 2"), std::string::npos);
  EXPECT_NE(refusal({}, given(1, -1)).find("give both"), std::string::npos);
}

TEST(RankDiscovery, TheDataPlaneMustMatchTheLauncher) {
  const Ranks r = discover_ranks(kTorchrun);
  check_world_size(r, 2, "MPI's world");
  try {
    check_world_size(r, 1, "MPI's world");
    FAIL() << "a world of 1 under WORLD_SIZE=2 passed";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.message()).find("the launcher started 2 ranks (torchrun: RANK=1, WORLD_SIZE=2"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.message()).find("MPI's world has 1 rank:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mp
