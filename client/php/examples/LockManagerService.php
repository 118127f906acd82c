<?php

// summit-api's LockManagerService pattern (a lock around one piece of work
// in a PHP-FPM request, once SET NX EX + a token + a Lua compare-and-delete
// + a retry loop) on raftlock's one-call Lock: one write to take the lock,
// one to give it back, a FIFO queue instead of the retry loop, and a fence
// to hand to the stores the work writes to.

declare(strict_types=1);

namespace Raftlock\Examples;

use Raftlock\Client;

final class UnacquiredLockException extends \RuntimeException
{
}

final class LockManagerService
{
    /** @var array<string, int> session id of each lock this service holds */
    private array $sessions = [];

    /**
     * @param int $maxWaitMs how long acquireLock waits in the queue
     */
    public function __construct(private Client $client, private int $maxWaitMs = 10000)
    {
    }

    /**
     * Takes $name in a session whose ttl is $lifetime seconds (the lock ends by itself if
     * this process dies holding it; a process that dies waiting leaves
     * nothing queued) and returns its fence.
     *
     * The default is 30 s, not summit-api's 3600: a worker killed while it
     * holds the lock frees it about 0.8 s later (the leader ends its
     * session 750 ms, the client's default end_on_disconnect_ms, after its
     * connection closes), but a live worker whose work makes no call
     * into the client keeps the name for up to its lifetime. Pick one that
     * covers the work.
     */
    public function acquireLock(string $name, int $lifetime = 30): int
    {
        $r = $this->client->lock($name, $lifetime * 1000, $this->maxWaitMs);
        if (!$r['acquired']) {
            throw new UnacquiredLockException("lock $name not acquired within {$this->maxWaitMs} ms");
        }
        $this->sessions[$name] = $r['session_id'];

        return $r['fence'];
    }

    public function releaseLock(string $name): void
    {
        if (isset($this->sessions[$name])) {
            $this->client->unlock($this->sessions[$name]);
            unset($this->sessions[$name]);
        }
    }

    /**
     * Runs $callback($fence) while holding $name.
     *
     * @return mixed what $callback returns
     */
    public function lock(string $name, \Closure $callback, int $lifetime = 30)
    {
        $fence = $this->acquireLock($name, $lifetime);
        try {
            return $callback($fence);
        } finally {
            $this->releaseLock($name);
        }
    }
}
