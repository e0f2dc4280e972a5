// The internal tuning-knob registry (src/core/knobs.h): a knob registers under its name with its
// default, set/get by name, values outside [min, max] and unknown names are ot::Error (the unknown
// name's message lists the known knobs), and the library's own knobs are registered at load.
#include <gtest/gtest.h>

#include <string>

#include "ot/error.h"
#include "src/core/knobs.h"

namespace test_knobs {
using namespace ot;

namespace {
knobs::Knob g_test_knob("test.knob", 5, 1, 9, "a knob of this test");
}

TEST(Knobs, SetGetByNameAndRange) {
  EXPECT_EQ(g_test_knob.get(), 5);
  EXPECT_EQ(knobs::get("test.knob"), 5);
  EXPECT_EQ(&knobs::find("test.knob"), &g_test_knob);
  knobs::set("test.knob", 9);
  EXPECT_EQ(g_test_knob.get(), 9);
  EXPECT_EQ(knobs::get("test.knob"), 9);
  EXPECT_THROW(knobs::set("test.knob", 10), Error);
  EXPECT_THROW(knobs::set("test.knob", 0), Error);
  EXPECT_EQ(g_test_knob.get(), 9);  // a rejected value leaves the knob as it was
  knobs::set("test.knob", g_test_knob.default_value());
  EXPECT_EQ(g_test_knob.get(), 5);
}

TEST(Knobs, UnknownNameListsTheKnownOnes) {
  try {
    knobs::set("no.such.knob", 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no.such.knob"), std::string::npos) << m;
    EXPECT_NE(m.find("test.knob"), std::string::npos) << m;
    EXPECT_NE(m.find("gemm.decode_rows"), std::string::npos) << m;
  }
  EXPECT_THROW(knobs::get("no.such.knob"), Error);
  EXPECT_THROW(knobs::find(""), Error);
}

TEST(Knobs, LibraryKnobsAreRegisteredWithTheirDefaults) {
  bool found = false;
  for (const knobs::Knob* k : knobs::all()) {
    EXPECT_EQ(k, &knobs::find(k->name()));
    EXPECT_LE(k->min(), k->default_value());
    EXPECT_LE(k->default_value(), k->max());
    EXPECT_EQ(k->get(), k->default_value()) << k->name();
    found = found || std::string(k->name()) == "gemm.decode_rows";
  }
  EXPECT_TRUE(found);
}

}  // namespace test_knobs
