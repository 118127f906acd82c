<?php

declare(strict_types=1);

namespace Raftlock\Symfony;

use Raftlock\Client;
use Raftlock\RaftlockException;
use Symfony\Component\Lock\BlockingSharedLockStoreInterface;
use Symfony\Component\Lock\BlockingStoreInterface;
use Symfony\Component\Lock\Exception\InvalidTtlException;
use Symfony\Component\Lock\Exception\LockConflictedException;
use Symfony\Component\Lock\Exception\LockExpiredException;
use Symfony\Component\Lock\Key;

/**
 * Symfony Lock's store on a raftlock cluster: exclusive and shared locks,
 * blocking or not, with FIFO queues on the leader (no polling), and a
 * fence per grant for the stores the holder writes to.
 *
 *     $store = new RaftlockStore('http://node1:7101,http://node2:7101,http://node3:7101');
 *     $lock = (new LockFactory($store))->createLock('invoice-42', 30);
 *
 * Each acquired Key holds a raftlock session of its own, opened and
 * acquired in one write (Lock) and ended in one (Unlock, on release). The
 * session starts with the store's initial ttl; `$lock->refresh($ttl)`
 * restarts it at $ttl (a KeepAlive, no write, when $ttl is the session's
 * ttl; a SetSessionTtl, one write, when it differs). The session ends
 * with the process (the client's end_on_disconnect_ms, default 750 ms,
 * after the process's KeepAlive stream closes), and the client renews it
 * on that stream at every call (see Client). The Key's lifetime is the
 * client's count: isExpired() while the lock is in jeopardy or lost;
 * exists() (isAcquired()) checks the fence, then renews. A process that
 * dies while it waits (`acquire(true)`) leaves nothing queued.
 *
 * The Key carries the session id, the fence, the session's next seq and
 * its grace, so
 * a serialized Key can be released, refreshed or checked by another
 * process (stop using it in the first one).
 *
 * Changing a held Key's mode changes its grant in place, with no window
 * for another process: `acquire()` after `acquireRead()` upgrades it (a
 * new grant with a new, larger fence, granted once the other readers have
 * left; it waits ahead of everyone queued, keeping the read), and
 * `acquireRead()` after `acquire()` downgrades it at once (same fence).
 */
final class RaftlockStore implements BlockingSharedLockStoreInterface, BlockingStoreInterface
{
    use TracksKeyState;

    /** The part of the lease length the Key's lifetime leaves out (from the send time), as the client's count. */
    public const LEASE_MARGIN = 0.1;

    private Client $client;
    private float $initialTtl;

    /**
     * @param string|Client $endpoints  comma-separated node URLs, or a Client
     * @param string|null   $token      sent as "Authorization: Bearer TOKEN"
     * @param float         $initialTtl the session ttl of a newly acquired lock, in seconds (1..=3600)
     */
    public function __construct($endpoints, ?string $token = null, float $initialTtl = 300.0)
    {
        $this->client = $endpoints instanceof Client ? $endpoints : new Client($endpoints, $token);
        self::ttlMs($initialTtl);
        $this->initialTtl = $initialTtl;
    }

    public function save(Key $key): void
    {
        $this->acquire($key, Client::EXCLUSIVE, false);
    }

    public function saveRead(Key $key): void
    {
        $this->acquire($key, Client::SHARED, false);
    }

    public function waitAndSave(Key $key): void
    {
        $this->acquire($key, Client::EXCLUSIVE, true);
    }

    public function waitAndSaveRead(Key $key): void
    {
        $this->acquire($key, Client::SHARED, true);
    }

    public function putOffExpiration(Key $key, float $ttl): void
    {
        $ttlMs = self::ttlMs($ttl);
        $state = $this->state($key);
        if (null === $state) {
            throw new LockConflictedException(sprintf('The "%s" lock is not held through this key.', $key));
        }
        $this->renew($key, $state, $ttlMs);
        $this->checkNotExpired($key);
    }

    public function delete(Key $key): void
    {
        $state = $this->state($key);
        if (null === $state) {
            return;
        }
        $this->client->unlock($state['session']);
        $key->removeState(__CLASS__);
    }

    /**
     * Asks the cluster whether the Key's grant is current (CheckFence),
     * then renews its session (until an answer leaves it held, as
     * Client::isHeld()): true only if both say so. The Key's lifetime is
     * set to what the count then believes.
     */
    public function exists(Key $key): bool
    {
        $state = $this->state($key);
        if (null === $state) {
            return false;
        }
        // The fence first, the renewal last: the Key's lifetime then counts
        // from a renewal answered after the CheckFence, however long that took.
        $held = $this->client->checkFence((string) $key, $state['fence']) && $this->client->isHeld($state['session']);
        $this->setLifetime($key, $state);

        return $held && !$key->isExpired();
    }

    /**
     * The fence of the grant $key holds (for the stores the holder writes
     * to), or null if it holds none.
     */
    public static function fence(Key $key): ?int
    {
        $state = $key->hasState(__CLASS__) ? $key->getState(__CLASS__) : null;

        return null === $state ? null : $state['fence'];
    }

    private function acquire(Key $key, string $mode, bool $wait): void
    {
        $state = $this->state($key);
        if (null !== $state) {
            if ($state['mode'] === $mode && $this->client->checkFence((string) $key, $state['fence'])) {
                // Already held through this key: restart its lease, as
                // Redis' save does for its own token.
                $this->renew($key, $state, $state['ttl_ms']);
                $this->checkNotExpired($key);

                return;
            }
            if ($this->client->checkFence((string) $key, $state['fence'])) {
                // Held in the other mode: upgrade or downgrade the grant in
                // its session, with no window for anyone else.
                $this->changeMode($key, $state, $mode, $wait);

                return;
            }
            // No longer held: end the old session first.
            $this->client->unlock($state['session']);
            $key->removeState(__CLASS__);
        }
        $ttlMs = self::ttlMs($this->initialTtl);
        // The client counts the lease from the send and has the stream
        // carry the session (renewed at once after a wait).
        $r = $this->client->lock((string) $key, $ttlMs, $wait ? null : 0, $mode);
        if (!$r['acquired']) {
            throw new LockConflictedException(sprintf('The "%s" lock is held by another.', $key));
        }
        $state = [
            'session' => $r['session_id'],
            'fence' => $r['fence'],
            'next_seq' => $r['next_seq'],
            'ttl_ms' => $r['ttl_ms'] ?: $ttlMs,
            'mode' => $mode,
            'grace_ms' => $this->client->endOnDisconnectMs(),
        ];
        $key->setState(__CLASS__, $state);
        $this->setLifetime($key, $state);
        $this->checkNotExpired($key);
    }

    /**
     * Turns the Key's grant into $mode: a downgrade at once, or an upgrade
     * that, when other readers hold the lock, waits ahead of everyone
     * queued (blocking: in rounds of a third of the session's ttl, renewing
     * the session between them, so that it lives on whatever the stream
     * does; not
     * blocking: not at all). An upgrade refused because another reader is
     * upgrading the same lock (they would wait for each other forever) is
     * a conflict; the read stays held either way.
     *
     * @param array{session: int, fence: int, next_seq: int, ttl_ms: int, mode: string} $state
     */
    private function changeMode(Key $key, array $state, string $mode, bool $wait): void
    {
        // Spend each seq before sending: a seq is never reused, even if a
        // request's outcome stays unknown.
        $seq = $state['next_seq'];
        $state['next_seq'] = $seq + 1;
        $key->setState(__CLASS__, $state);
        if (Client::SHARED === $mode) {
            $this->client->downgrade($state['session'], $seq, (string) $key, $state['fence']);
            $state['mode'] = Client::SHARED;
            $key->setState(__CLASS__, $state);
        } else {
            while (true) {
                try {
                    $r = $this->client->upgrade($state['session'], $seq, (string) $key, $state['fence'], $wait ? intdiv($state['ttl_ms'], 3) : 0);
                } catch (RaftlockException $e) {
                    if ('ABORTED' === $e->getStatus()) {
                        throw new LockConflictedException(sprintf('The "%s" lock cannot be promoted: another reader is promoting it (release and acquire again).', $key), 0, $e);
                    }
                    throw $e;
                }
                if ($r['acquired']) {
                    $state['fence'] = $r['fence'];
                    $state['mode'] = Client::EXCLUSIVE;
                    $key->setState(__CLASS__, $state);
                    break;
                }
                if (!$wait) {
                    throw new LockConflictedException(sprintf('The "%s" lock has other readers: not promoted.', $key));
                }
                // Still waiting: renew the session and ask again. No
                // writer can get in while this read is held; a reader may
                // between rounds, and the next round waits for it too.
                $this->renew($key, $state, $state['ttl_ms']);
                $seq = $state['next_seq'];
                $state['next_seq'] = $seq + 1;
                $key->setState(__CLASS__, $state);
            }
        }
        $this->renew($key, $state, $state['ttl_ms']);
        $this->checkNotExpired($key);
    }

    /**
     * Restarts the session's lease at $ttlMs (again until an answer leaves
     * it held), and sets the Key's lifetime to what the count believes.
     *
     * @param array{session: int, fence: int, next_seq: int, ttl_ms: int, mode: string, grace_ms: int} $state
     */
    private function renew(Key $key, array $state, int $ttlMs): void
    {
        if ($ttlMs === $state['ttl_ms']) {
            $alive = $this->client->keepAlive($state['session']);
        } else {
            // Spend the seq before sending: a seq is never reused, even if
            // this request's outcome stays unknown.
            $seq = $state['next_seq'];
            $state['next_seq'] = $seq + 1;
            $key->setState(__CLASS__, $state);
            try {
                $this->client->setSessionTtl($state['session'], $seq, $ttlMs);
                $state['ttl_ms'] = $ttlMs;
                $key->setState(__CLASS__, $state);
                $alive = true;
            } catch (RaftlockException $e) {
                if ('NOT_FOUND' !== $e->getStatus()) {
                    throw $e;
                }
                $alive = false;
            }
        }
        if ($alive && 'jeopardy' === $this->client->state($state['session'])) {
            // Answered, but late (a busy machine): renew again.
            $alive = $this->client->isHeld($state['session']) || 'lost' !== $this->client->state($state['session']);
        }
        if (!$alive) {
            $key->removeState(__CLASS__);
            $key->reduceLifetime(0);
            throw new LockConflictedException(sprintf('The "%s" lock was lost: its session ended.', $key));
        }
        $this->setLifetime($key, $state);
    }

    /**
     * The Key's lifetime: what the client's count still believes (0 in
     * jeopardy or once lost), so that isExpired() and
     * getRemainingLifetime() say whether the holder may act.
     *
     * @param array{session: int} $state
     */
    private function setLifetime(Key $key, array $state): void
    {
        $key->resetLifetime();
        $key->reduceLifetime($this->client->heldFor($state['session']));
    }

    private function checkNotExpired(Key $key): void
    {
        if ($key->isExpired()) {
            try {
                $this->delete($key);
            } catch (\Exception $e) {
                // The original problem is the expiry.
            }
            throw new LockExpiredException(sprintf('Failed to store the "%s" lock.', $key));
        }
    }


    private static function ttlMs(float $ttl): int
    {
        $ms = (int) ceil($ttl * 1000);
        if ($ms < Client::MIN_TTL_MS || $ms > Client::MAX_TTL_MS) {
            throw new InvalidTtlException(sprintf('raftlock sessions last 1 to 3600 seconds, got %s.', $ttl));
        }

        return $ms;
    }
}
