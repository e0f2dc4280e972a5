// main of the expert-parallel tests: MPI around GoogleTest; the run fails if any rank fails.
#include "ep_test_util.h"

#include <cstdio>

using ot::ep::test::me;

namespace {

// Ranks other than 0 print only their failures (rank-prefixed).
struct FailurePrinter : ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::fprintf(stderr, "[rank %d] %s:%d: %s\n", me(), r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (me() != 0) {  // one rank prints the progress; failures on any rank still fail the run
    auto& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new FailurePrinter);
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc != 0) std::fprintf(stderr, "rank %d: tests failed\n", me());
  MPI_Finalize();
  return any;
}
