// Package deploy tests cairn as an operator installs it: the systemd
// units in deploy/systemd (checked by systemd-analyze), and the daemons
// started as those units start them (their ExecStart, configured only by
// their EnvironmentFile), telling the service manager they are ready,
// answering their health endpoints, and restarted one by one under a
// running job that never notices.
package deploy
