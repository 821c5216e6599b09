#pragma once
// Local TCP ports for tests.

namespace strata::testing {

// A socket bound to 127.0.0.1 on a free port (not listening); *port is it.
int BoundSocket(int* port);
// A TCP port that was free a moment ago on 127.0.0.1.
int FreePort();

}  // namespace strata::testing
