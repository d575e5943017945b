#pragma once
// The exit status of every sample and tool (README, "Command lines and exit
// status"), so a script can tell a mistyped command from a failed run:
//   0    success (--help included);
//   1    a run-time error: a bad file, a NaN loss, a dead peer...;
//   2    a command-line error: an unknown flag, a value out of range, a
//        missing program for redco-run; one line on stderr says which;
//   130  interrupted (Ctrl-C; 128 + N for another signal N, as shells report).
// redco-run exits with a failed rank's status (128 + N for a rank killed by
// signal N, 124 for a hang, as timeout(1)).
namespace redco::exit_status {

inline constexpr int ok = 0;
inline constexpr int runtime_error = 1;
inline constexpr int usage_error = 2;
inline constexpr int interrupted = 130;

}  // namespace redco::exit_status
