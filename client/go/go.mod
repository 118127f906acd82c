module example.invalid/raftlock/client/go/raftlock

go 1.19
