// tests/mpi/mpi_test.h: multi-rank GoogleTest harness. Binaries linking
// mp_mpi_test_main run under `launch/mprun -np N` through CTest.
//
// Note [Agreeing on pass/fail across ranks]
// Every test derives from MpiTest. Its TearDown exchanges each rank's
// pass/fail with every other rank (point-to-point, on a communicator of its
// own, so it cannot be confused with a collective under test), then:
// - a rank whose own checks passed fails the test anyway when another rank
//   failed, naming the failed ranks, so every rank reports the same verdict;
// - when some rank does not reach the end of the test within
//   MP_TEST_AGREE_TIMEOUT_S seconds (default 120), the ranks that did print
//   which ranks are missing and abort the job: one rank stuck in a
//   collective that another rank left early cannot hang the suite.
// The process exit code is the same on every rank.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

namespace mp::testing {

class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // A communicator private to this test (a duplicate of MPI_COMM_WORLD).
  MPI_Comm comm() const { return comm_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// The ranks whose `local_failed` is true, known on every rank. Used by the
// harness; exposed so a test can check the agreement itself. Aborts the job
// (after naming the missing ranks) when some rank does not answer within the
// timeout.
std::vector<int> failed_ranks(bool local_failed, const char* what);

}  // namespace mp::testing
