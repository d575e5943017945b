// Placeholder: being written.
#include <catch2/catch.hpp>
