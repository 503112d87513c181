#include "tests/mpi/mpi_test.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "comm/mpi/mpi_error.h"
#include "comm/mpi/mpi_world.h"

namespace mp::testing {
namespace {

MPI_Comm g_agree_comm = MPI_COMM_NULL;  // harness-only communicator
int g_round = 0;                        // one tag per agreement round

double agree_timeout_s() {
  const char* v = std::getenv("MP_TEST_AGREE_TIMEOUT_S");
  return v ? std::atof(v) : 120.0;
}

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

// Prints only failures on ranks other than 0, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":"
                << r.line_number() << ": failure\n"
                << r.summary() << std::endl;
    }
  }

 private:
  int rank_;
};

}  // namespace

std::vector<int> failed_ranks(bool local_failed, const char* what) {
  int rank = 0, size = 1;
  MPI_Comm_rank(g_agree_comm, &rank);
  MPI_Comm_size(g_agree_comm, &size);
  const int tag = g_round++ % 32000;
  int mine = local_failed ? 1 : 0;
  std::vector<int> theirs(size, 0);
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    reqs.emplace_back();
    MP_CHECK_MPI(MPI_Irecv(&theirs[r], 1, MPI_INT, r, tag, g_agree_comm, &reqs.back()));
  }
  std::vector<MPI_Request> sends;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    sends.emplace_back();
    MP_CHECK_MPI(MPI_Isend(&mine, 1, MPI_INT, r, tag, g_agree_comm, &sends.back()));
  }
  theirs[rank] = mine;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(agree_timeout_s());
  for (;;) {
    int done = 0;
    MP_CHECK_MPI(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<int> missing;
      for (int r = 0, i = 0; r < size; ++r) {
        if (r == rank) continue;
        int arrived = 0;
        MPI_Test(&reqs[i++], &arrived, MPI_STATUS_IGNORE);
        if (!arrived) missing.push_back(r);
      }
      std::cerr << "[rank " << rank << "] " << what << ": rank(s) " << join(missing)
                << " did not finish within " << agree_timeout_s()
                << " s (stuck in a collective another rank left?); aborting the job" << std::endl;
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MP_CHECK_MPI(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE));
  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    if (theirs[r]) failed.push_back(r);
  }
  return failed;
}

void MpiTest::SetUp() {
  MP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  MP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  MP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

void MpiTest::TearDown() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  const auto failed = failed_ranks(HasFailure(), name.c_str());
  if (!failed.empty() && !HasFailure()) {
    ADD_FAILURE() << name << " failed on rank(s) " << join(failed);
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

}  // namespace mp::testing

int main(int argc, char** argv) {
  std::unique_ptr<mp::MpiWorld> world;
  try {
    world = std::make_unique<mp::MpiWorld>(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &mp::testing::g_agree_comm);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world->rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mp::testing::RankFailurePrinter(world->rank()));
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Comm_free(&mp::testing::g_agree_comm);
  return any;
}
