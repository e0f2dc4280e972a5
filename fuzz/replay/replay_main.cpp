// A driver for the fuzz targets without libFuzzer: runs every file of the given corpus folders
// through LLVMFuzzerTestOneInput, then a fixed number of deterministic mutations of them (bit
// flips, boundary bytes, insertions, erasures, truncations; the same sequence on every run). The
// GCC sanitizer build links each target with it, so ./test.sh replays the checked-in corpora and
// explores around them under ASan+UBSan without a clang build; coverage-guided runs are
// scripts/fuzz.sh. Usage: fuzz_replay_<target> [--mutations N] DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
};

Bytes mutate(Bytes b, SplitMix& rng) {
  static const uint8_t kBoundary[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0x40, 0x20};
  const int edits = 1 + int(rng.below(4));
  for (int e = 0; e < edits; ++e) {
    switch (rng.below(6)) {
      case 0: if (!b.empty()) b[rng.below(b.size())] ^= uint8_t(1u << rng.below(8)); break;
      case 1: if (!b.empty()) b[rng.below(b.size())] = kBoundary[rng.below(sizeof kBoundary)]; break;
      case 2: b.insert(b.begin() + std::ptrdiff_t(rng.below(b.size() + 1)), uint8_t(rng.next())); break;
      case 3: if (!b.empty()) b.erase(b.begin() + std::ptrdiff_t(rng.below(b.size()))); break;
      case 4: b.resize(rng.below(b.size() + 1)); break;
      default: if (!b.empty()) b[rng.below(b.size())] = uint8_t(rng.next()); break;
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 0;
  std::vector<Bytes> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
      continue;
    }
    std::vector<std::filesystem::path> files;
    for (const auto& f : std::filesystem::directory_iterator(a))
      if (f.is_regular_file()) files.push_back(f.path());
    std::sort(files.begin(), files.end());  // the same order, so the same mutations, on every run
    for (const auto& p : files) {
      std::ifstream in(p, std::ios::binary);
      corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (corpus.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations N] CORPUS_DIR...: no corpus files found\n", argv[0]);
    return 2;
  }
  for (const Bytes& b : corpus) LLVMFuzzerTestOneInput(b.data(), b.size());
  SplitMix rng{0x5eed};
  for (long m = 0; m < mutations; ++m) {
    const Bytes b = mutate(corpus[rng.below(corpus.size())], rng);
    LLVMFuzzerTestOneInput(b.data(), b.size());
  }
  std::printf("%zu corpus inputs and %ld mutations ran clean\n", corpus.size(), mutations);
  return 0;
}
