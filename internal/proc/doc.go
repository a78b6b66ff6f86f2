// Package proc is cairn's one place for processes as the kernel shows
// them:
//
//   - RunGroup runs a command whose whole process tree must end with it
//     (hooks, health probes): in a process group of its own, killed as a
//     group at its timeout and when it ends.
//   - Runs tells whether a pid is a process that has not ended, a zombie
//     counting as ended; Parent and Children follow the process tree. All
//     three read /proc/PID/stat.
//   - ParseSignal reads a signal as people write it.
package proc
