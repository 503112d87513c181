#include "comm/rank_discovery.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/strings.h"

namespace mp {
namespace {

// One source's view of the process: -1 where it says nothing.
struct View {
  explicit View(RankSource s = RankSource::kNone) : source(s) {}
  RankSource source;
  int rank = -1, size = -1, local_rank = -1, local_size = -1;
  std::vector<std::string> read;  // "NAME=value" of every variable used

  std::string evidence() const {
    std::string s;
    for (const std::string& r : read) s += (s.empty() ? "" : ", ") + r;
    return s;
  }
};

class Reader {
 public:
  explicit Reader(const Environment& env) : env_(env) {}

  bool has(const char* name) const { return env_.count(name) > 0; }
  const std::string* text(const char* name, View& v) const {
    const auto it = env_.find(name);
    if (it == env_.end()) return nullptr;
    v.read.push_back(it->first + "=" + it->second);
    return &it->second;
  }
  std::optional<int> integer(const char* name, View& v) const {
    const std::string* s = text(name, v);
    if (s == nullptr) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long x = std::strtol(s->c_str(), &end, 10);
    if (s->empty() || *end != '\0' || errno != 0 || x < 0 || x > INT_MAX) {
      MP_THROW(ConfigError, "launch environment: ", name, "='", *s, "' is not a non-negative integer");
    }
    return static_cast<int>(x);
  }
  // The first of `names` present, all of them that are present equal.
  std::optional<int> agreed(std::initializer_list<const char*> names, View& v) const {
    std::optional<int> value;
    const char* first = nullptr;
    for (const char* n : names) {
      const std::optional<int> x = integer(n, v);
      if (!x) continue;
      if (value && *x != *value) {
        MP_THROW(ConfigError, "contradictory launch environment: ", first, "=", *value, " but ", n, "=", *x);
      }
      if (!value) value = x, first = n;
    }
    return value;
  }

 private:
  const Environment& env_;
};

void check_inside(const View& v, int index, int count, const char* index_name, const char* count_name) {
  if (index >= 0 && count >= 0 && index >= count) {
    MP_THROW(ConfigError, "contradictory launch environment (", rank_source_name(v.source), "): ", index_name, "=",
             index, " is not below ", count_name, "=", count, " (", v.evidence(), ")");
  }
}

// torchrun's variables, or Lightning's launcher's: WORLD_SIZE, LOCAL_RANK
// and NODE_RANK without RANK (RANK = LOCAL_RANK on node 0; on other nodes
// only the trainer knows it: rank -1).
std::optional<View> torchrun_view(const Reader& env) {
  if (!env.has("RANK") && !env.has("WORLD_SIZE")) return std::nullopt;
  View v(RankSource::kTorchrun);
  const std::optional<int> rank = env.integer("RANK", v), size = env.integer("WORLD_SIZE", v);
  v.local_rank = env.integer("LOCAL_RANK", v).value_or(-1);
  v.local_size = env.integer("LOCAL_WORLD_SIZE", v).value_or(-1);
  const bool lightning = !rank && size && v.local_rank >= 0;
  if ((!rank || !size) && !lightning) {
    MP_THROW(ConfigError, "launch environment: ", rank ? "RANK" : "WORLD_SIZE", " is set but ",
             rank ? "WORLD_SIZE" : "RANK", " is not (torchrun sets both)");
  }
  v.size = *size;
  v.rank = rank ? *rank : env.integer("NODE_RANK", v).value_or(0) == 0 ? v.local_rank : -1;
  check_inside(v, v.rank, v.size, "RANK", "WORLD_SIZE");
  check_inside(v, v.local_rank, v.local_size, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return v;
}

std::optional<View> mpi_view(const Reader& env) {
  if (!env.has("OMPI_COMM_WORLD_RANK") && !env.has("PMI_RANK") && !env.has("PMIX_RANK")) return std::nullopt;
  View v(RankSource::kMpi);
  v.rank = *env.agreed({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, v);
  v.size = env.agreed({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, v).value_or(-1);
  v.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", v).value_or(-1);
  v.local_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", v).value_or(-1);
  check_inside(v, v.rank, v.size, "its rank", "its size");
  return v;
}

// "node[3-5,9],login" -> "node3"; "a,b" -> "a".
std::string first_host(const std::string& list) {
  const size_t stop = list.find_first_of(",[");
  if (stop == std::string::npos || list[stop] == ',') return list.substr(0, stop);
  const size_t digits = list.find_first_not_of("0123456789", stop + 1);
  return list.substr(0, stop) + list.substr(stop + 1, digits - stop - 1);
}

// Entry `node` of "2(x3),1" (tasks on each node of the step).
int tasks_on_node(const std::string& per_node, int node) {
  for (const std::string& part : split(per_node, ',')) {
    const int tasks = std::atoi(part.c_str());
    const size_t x = part.find("(x");
    const int repeat = x == std::string::npos ? 1 : std::atoi(part.c_str() + x + 2);
    if (node < repeat) return tasks;
    node -= repeat;
  }
  return -1;
}

std::optional<View> slurm_view(const Reader& env, std::string* master, int* port) {
  if (!env.has("SLURM_PROCID") || !(env.has("SLURM_STEP_ID") || env.has("SLURM_STEPID"))) return std::nullopt;
  View v(RankSource::kSlurm);
  v.rank = *env.integer("SLURM_PROCID", v);
  v.size = env.agreed({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, v).value_or(-1);
  if (v.size < 0) MP_THROW(ConfigError, "launch environment: SLURM_PROCID is set but not SLURM_NTASKS");
  v.local_rank = env.integer("SLURM_LOCALID", v).value_or(-1);
  View quiet;  // read without listing
  if (const std::string* per_node = env.text("SLURM_STEP_TASKS_PER_NODE", quiet)) {
    v.local_size = tasks_on_node(*per_node, env.integer("SLURM_NODEID", quiet).value_or(0));
  }
  check_inside(v, v.rank, v.size, "SLURM_PROCID", "SLURM_NTASKS");
  for (const char* n : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const std::string* list = env.text(n, v)) {
      *master = first_host(*list);
      break;
    }
  }
  if (const std::optional<int> job = env.integer("SLURM_JOB_ID", v)) *port = 20000 + *job % 20000;
  return v;
}

// Note [Rank discovery]: `a` (the chosen source or the arguments) against
// `b` (MPI's view).
void check_agree(const View& a, const View& b) {
  if (a.rank < 0 || b.rank < 0) return;
  if (a.size < 0 || b.size < 0) {
    if (a.size < 0 || b.rank == a.rank) return;
  } else if (a.size == b.size && a.rank == b.rank) {
    return;
  } else if (a.local_size > 0 && a.size == b.size * a.local_size && a.rank / a.local_size == b.rank) {
    return;  // a runs local_size processes under each of b's
  }
  MP_THROW(ConfigError, "contradictory launch environment: ", rank_source_name(a.source), " says rank ", a.rank,
           " of ", a.size, " (", a.evidence(), ") but ", rank_source_name(b.source), " says rank ", b.rank, " of ",
           b.size, " (", b.evidence(), ")");
}

}  // namespace

Environment process_environment() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string s(*e);
    const size_t eq = s.find('=');
    if (eq != std::string::npos) env.emplace(s.substr(0, eq), s.substr(eq + 1));
  }
  return env;
}

std::string_view rank_source_name(RankSource source) {
  switch (source) {
    case RankSource::kExplicit: return "explicit";
    case RankSource::kTorchrun: return "torchrun";
    case RankSource::kMpi: return "MPI";
    case RankSource::kSlurm: return "Slurm";
    case RankSource::kNone: return "none";
  }
  return "?";
}

std::string Ranks::describe() const {
  return detail::str("ranks: ", rank_source_name(source), evidence.empty() ? "" : " (", evidence,
                     evidence.empty() ? "" : ")", ": rank ", rank, " of ", size < 0 ? "?" : std::to_string(size),
                     ", local ", local_rank, " of ", local_size);
}

Ranks discover_ranks(const Environment& environment, const RankArguments& given) {
  const Reader env(environment);
  std::string slurm_master;
  int slurm_port = 0;
  const std::optional<View> torchrun = torchrun_view(env), mpi = mpi_view(env),
                            slurm = slurm_view(env, &slurm_master, &slurm_port);
  std::optional<View> chosen;
  if (given.rank >= 0 || given.world_size >= 0) {
    if (given.rank < 0 || given.world_size <= 0) {
      MP_THROW(ConfigError, "rank=", given.rank, " and world_size=", given.world_size,
               ": give both (rank from 0 to world_size - 1), or neither");
    }
    View v(RankSource::kExplicit);
    v.rank = given.rank, v.size = given.world_size, v.local_rank = given.local_rank;
    v.local_size = given.local_world_size;
    v.read = {detail::str("rank=", given.rank), detail::str("world_size=", given.world_size)};
    check_inside(v, v.rank, v.size, "rank", "world_size");
    if (torchrun) check_agree(v, *torchrun);
    chosen = v;
  } else {
    chosen = torchrun ? torchrun : mpi ? mpi : slurm;
    if (chosen && chosen->rank < 0) {
      MP_THROW(ConfigError, "launch environment (", chosen->evidence(), "): Lightning's launcher on a node other than "
               "the first says no global rank; pass mp.init(rank=..., world_size=...) (mp.lightning.MPStrategy does)");
    }
  }
  if (chosen && chosen->source != RankSource::kMpi && mpi) check_agree(*chosen, *mpi);
  // srun --mpi=pmix: PMIx gives the rank, the step's tasks are MPI's world.
  if (chosen && chosen->source == RankSource::kMpi && chosen->size < 0 && slurm) chosen->size = slurm->size;

  Ranks r;
  if (!chosen) return r;
  const View& v = *chosen;
  r.source = v.source;
  r.rank = v.rank;
  r.size = v.size;
  r.local_rank = v.local_rank >= 0 ? v.local_rank : v.rank;
  r.local_size = v.local_size > 0 ? v.local_size : std::max(v.size, r.local_rank + 1);
  if (r.uses_mpi()) {
    r.evidence = v.evidence();
    return r;
  }
  // The store.
  View extra;
  const std::string* addr = env.text("MASTER_ADDR", extra);
  const std::optional<int> port = env.integer("MASTER_PORT", extra);
  r.master_addr = !given.master_addr.empty() ? given.master_addr : addr ? *addr : slurm_master;
  r.master_port = given.master_port > 0 ? given.master_port : port ? *port : slurm_port;
  if (v.source == RankSource::kTorchrun) {
    View quiet;
    const std::string* agent = env.text("TORCHELASTIC_USE_AGENT_STORE", quiet);
    r.agent_store = agent != nullptr && *agent == "True";
  }
  r.evidence = v.evidence();
  for (const std::string& e : extra.read) r.evidence += ", " + e;
  if (r.size > 1 && (r.master_addr.empty() || r.master_port <= 0)) {
    MP_THROW(ConfigError, "launch environment (", rank_source_name(v.source), ": ", r.evidence, "): ", r.size,
             " ranks need a store; set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port)");
  }
  return r;
}

void check_world_size(const Ranks& ranks, int actual, std::string_view what) {
  if (ranks.size < 0 || ranks.size == actual) return;
  MP_THROW(ConfigError, "the launcher started ", ranks.size, " ranks (", rank_source_name(ranks.source), ": ",
           ranks.evidence, ") but ", what, " has ", actual, " rank", actual == 1 ? "" : "s",
           ": the data plane does not match the launcher (under torchrun or srun without MPI, call mp.init() from "
           "Python, which meets the other ranks through the launcher's store; run MPI programs under mpirun)");
}

}  // namespace mp
