<?php

// The PHP suite: `php client/php/tests/run.php [FILTER]` runs every test_*
// function (or those whose name contains FILTER) against a real raftlock
// cluster it starts, with Debian's php-symfony-lock and
// php-symfony-semaphore, and exits non-zero if any fails.

declare(strict_types=1);

namespace Raftlock\Tests;

require __DIR__.'/../autoload.php';
require __DIR__.'/Harness.php';
require __DIR__.'/Scenarios.php';
require __DIR__.'/FastCgi.php';
require_once __DIR__.'/../examples/LockManagerService.php';

use Raftlock\Client;
use Raftlock\Examples\LockManagerService;
use Raftlock\Examples\UnacquiredLockException;
use Raftlock\RaftlockException;
use Raftlock\Symfony\RaftlockSemaphoreStore;
use Raftlock\Symfony\RaftlockStore;
use Symfony\Component\Lock\Exception\InvalidTtlException;
use Symfony\Component\Lock\Exception\LockAcquiringException;
use Symfony\Component\Lock\Exception\LockConflictedException;
use Symfony\Component\Lock\Key;
use Symfony\Component\Lock\Lock;
use Symfony\Component\Lock\LockFactory;
use Symfony\Component\Semaphore\Exception\RuntimeException as SemaphoreRuntimeException;
use Symfony\Component\Semaphore\Exception\SemaphoreExpiredException;
use Symfony\Component\Semaphore\SemaphoreFactory;

/** A lock name no other test (or run) uses. */
function name(string $what): string
{
    return "php-test/$what/".bin2hex(random_bytes(4));
}

/** @return array{holders: list<array>, waiters: list<array>} */
function queue(Client $c, string $name): array
{
    $d = $c->describe($name);

    return ['holders' => $d['info']['holders'] ?? [], 'waiters' => $d['info']['waiters'] ?? []];
}

// ---- Symfony Lock: the examples of Symfony's documentation ----

function test_non_blocking_acquire(Cluster $cl): void
{
    $factory = new LockFactory(new RaftlockStore($cl->endpoints()));
    $name = name('pdf');
    $lock = $factory->createLock($name);
    check($lock->acquire(), 'the first acquire()');
    $other = $factory->createLock($name);
    check(!$other->acquire(), 'a second Lock on the resource while it is held');
    check($lock->isAcquired(), 'isAcquired() of the holder');
    check(!$other->isAcquired(), 'isAcquired() of the other');
    // Symfony's pitfall: acquire() twice on one Lock answers true.
    check($lock->acquire(), 'acquire() again on the holding Lock');
    checkSame(1, \count(queue(new Client($cl->endpoints()), $name)['holders']), 'holders after acquiring twice');
    $lock->release();
    check(!$lock->isAcquired(), 'isAcquired() after release()');
    check($other->acquire(), 'the other Lock after the release');
    $other->release();
    checkSame([], queue(new Client($cl->endpoints()), $name)['holders'], 'holders after both released');
}

function test_blocking_acquire_is_granted_on_release(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $name = name('blocking');
    $key = new Key($name);
    $lock = $factory->createLockFromKey($key);
    check($lock->acquire(), 'the holder');
    $held = RaftlockStore::fence($key);
    // acquire(true) waits in the node's queue (waitAndSave), not in a
    // polling loop: the queue shows it.
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    eventually(10, 'the worker queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A second waiter killed while it waits leaves nothing queued.
    $doomed = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $doomed->expect('WAITING');
    eventually(10, 'the second worker queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    $doomed->kill();
    eventually(10, "the killed worker's wait withdrawn", fn () => 1 === \count(queue($c, $name)['waiters']));
    $lock->release();
    $line = $w->expect('ACQUIRED fence ');
    $fence = (int) substr($line, \strlen('ACQUIRED fence '));
    check($fence > $held, "the waiter's fence $fence is larger than the holder's $held");
    $w->send('go');
    $w->expect('RELEASED');
    checkSame(['holders' => [], 'waiters' => []], queue($c, $name), 'the queue at the end');
}

function test_a_wait_withdrawn_under_it_waits_again(Cluster $cl): void
{
    // The node ends the session a blocking acquire waits in (here an
    // Unlock from elsewhere; in life, when an earlier attempt's connection
    // closed): the store waits again, in a new session.
    $c = new Client($cl->endpoints());
    $name = name('rewait');
    $lock = (new LockFactory(new RaftlockStore($c)))->createLock($name);
    check($lock->acquire(), 'the holder');
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    $first = 0;
    eventually(10, 'the worker queued', function () use ($c, $name, &$first) {
        $waiters = queue($c, $name)['waiters'];
        $first = (int) ($waiters[0]['session_id'] ?? 0);

        return 1 === \count($waiters);
    });
    checkSame(0, $c->unlock($first), 'grants released by ending the waiting session');
    eventually(10, 'the worker queued again, in a new session', function () use ($c, $name, $first) {
        $waiters = queue($c, $name)['waiters'];

        return 1 === \count($waiters) && (int) $waiters[0]['session_id'] !== $first;
    });
    $lock->release();
    $w->expect('ACQUIRED fence ');
    $w->send('done');
    $w->expect('RELEASED');
}

function test_readers_share_while_a_writer_waits(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('report');
    $readers = [];
    foreach (range(1, 3) as $i) {
        $r = new Worker(['read', $cl->endpoints(), $name]);
        $r->expect('WAITING');
        $r->expect('READING fence ');
        $readers[] = $r;
    }
    checkSame(3, \count(queue($c, $name)['holders']), 'readers holding together');
    $writer = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $writer->expect('WAITING');
    eventually(10, 'the writer queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A reader arriving now queues behind the writer (no barging).
    $late = new Worker(['read', $cl->endpoints(), $name]);
    $late->expect('WAITING');
    eventually(10, 'the late reader queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    foreach ($readers as $i => $r) {
        $r->send('done');
        $r->expect('RELEASED');
        if ($i < 2) {
            $q = queue($c, $name);
            checkSame([2 - $i, 2], [\count($q['holders']), \count($q['waiters'])], 'holders and waiters before the last reader releases');
        }
    }
    $writer->expect('ACQUIRED fence ');
    checkSame(1, \count(queue($c, $name)['waiters']), 'the late reader waits for the writer');
    $writer->send('done');
    $writer->expect('RELEASED');
    $late->expect('READING fence ');
    $late->send('done');
    $late->expect('RELEASED');
}

function test_serialized_key_released_by_another_process(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $store = new RaftlockStore($c);
    $name = name('handoff');
    $key = new Key($name);
    $lock = new Lock($key, $store, 300, false);
    check($lock->acquire(), 'acquire in the first process');
    $fence = RaftlockStore::fence($key);
    $w = new Worker(['handoff', $cl->endpoints(), base64_encode(serialize($key))]);
    $w->expect('ACQUIRED true');
    // The second process's refresh() uses the session's next seq, carried
    // by the key: a SetSessionTtl (60 s differs from the 300 s session).
    // The Key's lifetime is then the count of a session that ends with its
    // process: the grace (750 ms) less 10 %, from the send.
    $left = (float) substr($w->expect('REFRESHED '), \strlen('REFRESHED '));
    check($left > 0 && $left <= 0.675, "the remaining lifetime after refresh(60) in the second process: $left s");
    $w->expect('RELEASED false');
    check(!$c->checkFence($name, $fence), 'the fence is no longer current');
    $third = (new LockFactory($store))->createLock($name);
    check($third->acquire(), 'a third party after the release');
    $third->release();
}

// A Key whose session has no grace (end_on_disconnect_ms 0: the README's
// advice for a Key that must outlive the process that took it), handed to
// another process: held there from its first isAcquired(), never in
// jeopardy (its lease is its ttl).
function test_handed_over_key_without_grace_is_held(Cluster $cl): void
{
    $store = new RaftlockStore(new Client($cl->endpoints(), null, ['end_on_disconnect_ms' => 0]));
    $key = new Key(name('handoff-no-grace'));
    $lock = new Lock($key, $store, 300, false);
    check($lock->acquire(), 'acquire in the first process');
    $w = new Worker(['handoff', $cl->endpoints(), base64_encode(serialize($key))]);
    $w->expect('ACQUIRED true');
    $left = (float) substr($w->expect('REFRESHED '), \strlen('REFRESHED '));
    check($left > 0 && $left <= 54, "the remaining lifetime after refresh(60) in the second process: $left s");
    $w->expect('RELEASED false');
}

// With the grace off (end_on_disconnect_ms 0) a session's lease is its
// ttl: the Key's lifetime is the ttl less 10 %, and a lock not refreshed
// expires on the cluster after its ttl.
function test_refresh_keeps_an_expiring_lock_and_its_loss_is_seen(Cluster $cl): void
{
    $factory = new LockFactory(new RaftlockStore(new Client($cl->endpoints(), null, ['end_on_disconnect_ms' => 0])));
    $name = name('refresh');
    $lock = $factory->createLock($name, 2);
    check($lock->acquire(), 'acquire with a 2 s ttl');
    $left = $lock->getRemainingLifetime();
    check($left > 1.5 && $left <= 1.8, "remaining lifetime $left s: 2 s less the 10 % margin, from the send");
    $until = microtime(true) + 4;
    while (microtime(true) < $until) {
        usleep(500000); // the work of one item
        $lock->refresh();
    }
    check($lock->isAcquired(), 'held 4 s with a 2 s ttl, refreshed every item');
    $lock->refresh(5);
    $left = $lock->getRemainingLifetime();
    check($left > 4 && $left <= 4.5, "remaining lifetime $left s after refresh(5)");
    $lock->refresh(2);
    // Not refreshed any more: the session expires and another takes it.
    $other = $factory->createLock($name, 10);
    eventually(10, 'the unrefreshed lock to expire', fn () => $other->acquire());
    check(!$lock->isAcquired(), 'isAcquired() after the expiry');
    check($lock->isExpired(), 'isExpired() after the expiry');
    checkThrows(LockConflictedException::class, 'lost', fn () => $lock->refresh());
    $other->release();
}

function test_lock_without_ttl_lives_the_stores_initial_ttl(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c, null, 1.0));
    $name = name('no-ttl');
    $lock = $factory->createLock($name, null);
    check($lock->acquire(), 'acquire');
    $left = $lock->getRemainingLifetime();
    check(null !== $left && $left <= 0.675, "remaining lifetime $left s: the grace (750 ms, under the initial 1 s ttl) less the margin");
    // Without a call into the client nothing renews it (the stream stays
    // open): the cluster ends it after its ttl. Watch without a Client.
    eventually(10, 'the session to expire after its initial ttl', fn () => [] === rawHolders($cl, $name));
    check(!$lock->isAcquired(), 'isAcquired() after the expiry');
}

function test_promotion_upgrades_in_place_ahead_of_a_waiting_writer(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $name = name('promote');
    $key = new Key($name);
    $lock = $factory->createLockFromKey($key);
    check($lock->acquireRead(), 'acquireRead');
    $read = RaftlockStore::fence($key);
    $session = (int) queue($c, $name)['holders'][0]['session_id'];
    // A writer queues behind the read. Releasing the read and locking
    // anew would hand the lock to it; an upgrade goes first.
    $w = new Worker(['lock-wait', $cl->endpoints(), $name]);
    $w->expect('WAITING');
    eventually(10, 'the writer queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    check($lock->acquire(), 'acquire (promotion) with a writer queued');
    $write = RaftlockStore::fence($key);
    check($write > $read, "the upgrade's fence $write is larger than the read's $read");
    $q = queue($c, $name);
    checkSame([[(string) $session, (string) $write, 'MODE_EXCLUSIVE']], array_map(fn ($h) => [$h['session_id'], $h['fence'], $h['mode'] ?? 'MODE_EXCLUSIVE'], $q['holders']), 'holders after the promotion: the same session');
    checkSame(1, \count($q['waiters']), 'the writer still waits');
    // Demotion keeps the fence, in the same session.
    check($lock->acquireRead(), 'acquireRead (demotion)');
    checkSame($write, RaftlockStore::fence($key), 'the fence after the demotion');
    checkSame(['MODE_SHARED'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'holders after the demotion');
    $lock->release();
    $line = $w->expect('ACQUIRED fence ');
    check((int) substr($line, \strlen('ACQUIRED fence ')) > $write, 'the writer comes after the upgraded grant');
    $w->send('go');
    $w->expect('RELEASED');
}

function test_a_second_reader_promoting_is_refused_and_keeps_its_read(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('promote2');
    $p = new Worker(['promote', $cl->endpoints(), $name]);
    $p->expect('READING fence ');
    $key = new Key($name);
    $lock = (new LockFactory(new RaftlockStore($c)))->createLockFromKey($key);
    check($lock->acquireRead(), 'a second reader');
    check(!$lock->acquire(), 'a non-blocking promotion beside another reader');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held');
    // The worker's blocking promotion waits for this read.
    $p->send('go');
    $p->expect('PROMOTING');
    eventually(10, "the worker's upgrade waiting", fn () => 1 === \count(queue($c, $name)['waiters']));
    $threw = null;
    try {
        $lock->acquire(true);
    } catch (LockConflictedException $e) {
        $threw = $e;
    }
    check(null !== $threw && str_contains($threw->getMessage(), 'another reader is promoting'), 'a second blocking promotion is refused');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held after the refusal');
    $lock->release();
    $line = $p->expect('PROMOTED fence ');
    checkSame(['MODE_EXCLUSIVE'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'the worker holds it exclusively');
    $p->send('go');
    $p->expect('RELEASED');
}

function test_client_lock_all_is_all_or_nothing(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $a = name('all-a');
    $b = name('all-b');
    $r = $c->lockAll([$b => Client::EXCLUSIVE, $a => Client::SHARED], 10000);
    check($r['acquired'], 'lockAll of two free names');
    checkSame([$b, $a], array_column($r['grants'], 'name'), 'grants in the order asked');
    checkSame([Client::EXCLUSIVE, Client::SHARED], array_column($r['grants'], 'mode'), 'the modes');
    checkSame($r['grants'][0]['fence'] + 1, $r['grants'][1]['fence'], 'consecutive fences: one write');
    checkSame((string) $r['session_id'], queue($c, $a)['holders'][0]['session_id'], "a's holder");
    // Another request over a held name takes nothing, queues nothing.
    $c2 = name('all-c');
    $no = $c->lockAll([$c2 => Client::EXCLUSIVE, $b => Client::SHARED], 10000);
    check(!$no['acquired'] && 0 === $no['session_id'], 'lockAll over a held name');
    $t = microtime(true);
    $no = $c->lockAll([$c2 => Client::EXCLUSIVE, $b => Client::SHARED], 10000, 300);
    check(!$no['acquired'] && microtime(true) - $t >= 0.3, 'a bounded lockAll gives up after its timeout');
    checkSame(['holders' => [], 'waiters' => []], queue($c, $c2), 'nothing left on the free name');
    checkSame(0, \count(queue($c, $b)['waiters']), 'nothing queued on the held name');
    checkSame(2, $c->unlock($r['session_id']), 'unlock releases both');
    // Bad input is refused before anything is sent.
    $many = [];
    for ($i = 0; $i <= Client::MAX_NAMES_PER_LOCK_ALL; ++$i) {
        $many[name("many-$i")] = Client::EXCLUSIVE;
    }
    foreach ([[[], 10000, 0], [$many, 10000, 0], [[$a => 'MODE_SEMAPHORE'], 10000, 0], [['' => Client::EXCLUSIVE], 10000, 0],
              [[$a => Client::EXCLUSIVE], 10000, 10000], [[$a => Client::EXCLUSIVE], 10000, -1], [[$a => Client::EXCLUSIVE], 999, 0]] as [$locks, $ttl, $timeout]) {
        $threw = false;
        try {
            $c->lockAll($locks, $ttl, $timeout);
        } catch (\InvalidArgumentException $e) {
            $threw = true;
        }
        check($threw, 'bad lockAll input refused: '.\count($locks)." names, ttl $ttl, timeout $timeout");
    }
    checkSame(['holders' => [], 'waiters' => []], queue($c, $a), 'nothing taken by the refused requests');
    // Exactly the limit is granted.
    array_pop($many);
    $r = $c->lockAll($many, 10000);
    check($r['acquired'] && Client::MAX_NAMES_PER_LOCK_ALL === \count($r['grants']), 'lockAll of 64 names');
    checkSame(64, $c->unlock($r['session_id']), 'unlock releases all 64');
}

function test_client_upgrade_and_downgrade(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('upgrade');
    $r1 = $c->lock($name, 10000, 0, Client::SHARED);
    $r2 = $c->lock($name, 10000, 0, Client::SHARED);
    check($r1['acquired'] && $r2['acquired'], 'two readers');
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'], $name, $r1['fence'], 0);
    check(!$u['acquired'], 'a try upgrade beside another reader');
    $t = microtime(true);
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'] + 1, $name, $r1['fence'], 300);
    check(!$u['acquired'] && microtime(true) - $t >= 0.3, 'a bounded upgrade gives up after its timeout');
    checkSame(2, \count(queue($c, $name)['holders']), 'both reads still held');
    $threw = null;
    try {
        $c->upgrade($r1['session_id'], $r1['next_seq'] + 2, $name, $r1['fence'] + 1000, 0);
    } catch (RaftlockException $e) {
        $threw = $e->getStatus();
    }
    checkSame('FAILED_PRECONDITION', $threw, 'an upgrade of a grant not held');
    checkSame(1, $c->unlock($r2['session_id']), 'the other reader leaves');
    $u = $c->upgrade($r1['session_id'], $r1['next_seq'] + 3, $name, $r1['fence'], 0);
    check($u['acquired'] && $u['fence'] > $r2['fence'], 'the lone reader upgrades, to a new fence');
    checkSame([[$u['fence'], 'MODE_EXCLUSIVE']], array_map(fn ($h) => [(int) $h['fence'], $h['mode'] ?? 'MODE_EXCLUSIVE'], queue($c, $name)['holders']), 'holders after the upgrade');
    checkSame($u['fence'], $c->downgrade($r1['session_id'], $r1['next_seq'] + 4, $name, $u['fence']), 'the downgrade keeps the fence');
    checkSame(['MODE_SHARED'], array_map(fn ($h) => $h['mode'] ?? 'MODE_EXCLUSIVE', queue($c, $name)['holders']), 'holders after the downgrade');
    $threw = null;
    try {
        $c->downgrade($r1['session_id'], $r1['next_seq'] + 5, $name, $u['fence']);
    } catch (RaftlockException $e) {
        $threw = $e->getStatus();
    }
    checkSame('FAILED_PRECONDITION', $threw, 'a downgrade of a shared grant');
    checkSame(1, $c->unlock($r1['session_id']), 'unlock');
}

// ---- Symfony Semaphore ----

function test_weighted_semaphore(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $factory = new SemaphoreFactory(new RaftlockSemaphoreStore($c));
    $name = name('thumbs');
    $big = [];
    foreach (range(1, 4) as $i) {
        $s = $factory->createSemaphore($name, 10, 2); // images over 3840 px weigh 2
        check($s->acquire(), "weight-2 semaphore $i");
        $big[] = $s;
    }
    $small = [];
    foreach (range(1, 2) as $i) {
        $s = $factory->createSemaphore($name, 10, 1);
        check($s->acquire(), "weight-1 semaphore $i");
        $small[] = $s;
    }
    $heavy = $factory->createSemaphore($name, 10, 2);
    check(!$heavy->acquire(), 'weight 2 at 10/10');
    $small[0]->release();
    check(!$heavy->acquire(), 'weight 2 at 9/10');
    $small[1]->release();
    check($heavy->acquire(), 'weight 2 at 8/10');
    check($heavy->isAcquired(), 'isAcquired');
    $heavy->refresh(30);
    check($heavy->isAcquired(), 'isAcquired after refresh(30)');
    // Another limit for the same name is refused while permits are held.
    $e = checkThrows(SemaphoreRuntimeException::class, 'Failed to acquire', fn () => $factory->createSemaphore($name, 5)->acquire());
    checkThrows(RaftlockException::class, 'capacity', function () use ($e) {
        throw $e;
    });
    foreach (array_merge($big, [$heavy]) as $s) {
        $s->release();
    }
    checkSame([], queue($c, $name)['holders'], 'holders after every release');
}

function test_semaphore_expiry_is_reported(Cluster $cl): void
{
    $factory = new SemaphoreFactory(new RaftlockSemaphoreStore($cl->endpoints()));
    $name = name('sem-expiry');
    $s = $factory->createSemaphore($name, 1, 1, 1.0);
    check($s->acquire(), 'acquire with a 1 s ttl');
    $other = $factory->createSemaphore($name, 1, 1, 10.0);
    eventually(10, 'the unrefreshed permit to expire', fn () => $other->acquire());
    check(!$s->isAcquired(), 'isAcquired after the expiry');
    checkThrows(SemaphoreExpiredException::class, 'session ended', fn () => $s->refresh());
    $other->release();
}

// ---- summit-api's LockManagerService, over the one-call Lock ----

function test_lock_manager_service(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('tickets');
    $a = new Worker(['service', $cl->endpoints(), $name, '20000']);
    $first = (int) substr($a->expect('LOCKED fence '), 13);
    $b = new Worker(['service', $cl->endpoints(), $name, '20000']);
    eventually(10, 'b queued', fn () => 1 === \count(queue($c, $name)['waiters']));
    // A worker killed while it waits leaves nothing queued.
    $dead = new Worker(['service', $cl->endpoints(), $name, '20000']);
    eventually(10, 'the doomed worker queued', fn () => 2 === \count(queue($c, $name)['waiters']));
    $dead->kill();
    eventually(10, "the killed worker's wait withdrawn", fn () => 1 === \count(queue($c, $name)['waiters']));
    $a->send('done');
    $a->expect('DONE');
    $second = (int) substr($b->expect('LOCKED fence '), 13);
    check($second > $first, "fences grow: $first then $second");
    // While b holds it, a short wait gives up cleanly and leaves nothing.
    $service = new LockManagerService($c, 300);
    checkThrows(UnacquiredLockException::class, 'not acquired within 300 ms', fn () => $service->acquireLock($name, 30));
    checkSame(0, \count(queue($c, $name)['waiters']), 'waiters after the timed-out wait');
    $b->send('done');
    $b->expect('DONE');
    checkSame(42, $service->lock($name, fn (int $fence) => $fence > $second ? 42 : 0, 30), 'lock() runs the closure with a larger fence');
    checkSame([], queue($c, $name)['holders'], 'holders after lock() returned');
}

// ---- a process that dies frees its locks (issue 44) ----

/** One POST to node $addr with plain PHP streams (not through a Client, whose calls renew this process's sessions). */
function rawCall(string $addr, string $rpc, array $body, float $timeout = 5): array
{
    $ctx = stream_context_create(['http' => ['method' => 'POST', 'header' => "Content-Type: application/json\r\n", 'content' => json_encode((object) $body), 'ignore_errors' => true, 'timeout' => $timeout]]);
    $r = json_decode((string) @file_get_contents("http://$addr/v1/$rpc", false, $ctx), true);

    return \is_array($r) ? $r : [];
}

/** The session ids holding $name, read at the leader without a Client. */
function rawHolders(Cluster $cl, string $name): array
{
    $d = rawCall($cl->leader(), 'locks/Describe', ['name' => $name]);

    return array_map(fn ($h) => (int) $h['session_id'], $d['info']['holders'] ?? []);
}

/** The median of $xs. */
function median(array $xs): float
{
    sort($xs);
    $n = \count($xs);

    return $n % 2 ? $xs[intdiv($n, 2)] : ($xs[$n / 2 - 1] + $xs[$n / 2]) / 2;
}

/**
 * Three rounds: a holder process ($holder, a worker mode) takes a name, a
 * waiter process ($waiter) queues for it, the holder is SIGKILLed; the
 * waiter must be granted well before the holder's 30 s ttl. Prints the
 * kill-to-grant times (as this process reads the waiter's line).
 */
function killedHolderRounds(Cluster $cl, string $holder, string $waiter, string $granted, string $what): void
{
    $c = new Client($cl->endpoints());
    $took = [];
    foreach (range(1, 3) as $round) {
        $name = name("killed-holder-$round");
        $h = new Worker([$holder, $cl->endpoints(), $name]);
        $h->expect('HELD');
        $w = new Worker([$waiter, $cl->endpoints(), $name]);
        $w->expect('WAITING');
        eventually(10, 'the waiter queued', fn () => 1 === \count(queue($c, $name)['waiters']));
        $killed = microtime(true);
        $h->kill();
        $w->expect($granted, 10);
        $took[] = microtime(true) - $killed;
        check(end($took) < 10, sprintf('granted %.2f s after the kill', end($took)));
        $w->close();
        $h->close();
    }
    printf("     %s: SIGKILLed holder (ttl 30 s) to the waiter's grant: %s s, median %.2f s\n", $what,
        implode(', ', array_map(fn ($t) => sprintf('%.2f', $t), $took)), median($took));
}

// A holder at the client's defaults (ttl 30 s) SIGKILLed while another
// process waits: the waiter gets the lock within the grace, not the ttl.
function test_killed_holder_frees_its_lock_client(Cluster $cl): void
{
    killedHolderRounds($cl, 'hold', 'wait', 'GRANTED', 'Client');
}

function test_killed_holder_frees_its_lock_symfony(Cluster $cl): void
{
    killedHolderRounds($cl, 'sf-hold', 'lock-wait', 'ACQUIRED fence ', 'RaftlockStore');
}

// A waiter SIGKILLed while it waits leaves the queue, and one SIGKILLed
// just after its grant (before it could do anything) frees the lock a
// grace later: the process behind it gets the lock without waiting for the
// dead one's ttl. Three rounds; prints the kill-to-grant times.
function test_killed_waiter_passes_its_place_on(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $took = [];
    foreach (range(1, 3) as $round) {
        $name = name("killed-waiter-$round");
        $h = new Worker(['hold', $cl->endpoints(), $name]);
        $h->expect('HELD');
        $w1 = new Worker(['wait', $cl->endpoints(), $name]);
        $w1->expect('WAITING');
        eventually(10, 'the first waiter queued', fn () => 1 === \count(queue($c, $name)['waiters']));
        $w2 = new Worker(['wait', $cl->endpoints(), $name]);
        $w2->expect('WAITING');
        eventually(10, 'the second waiter queued', fn () => 2 === \count(queue($c, $name)['waiters']));
        $w3 = new Worker(['wait', $cl->endpoints(), $name]);
        $w3->expect('WAITING');
        eventually(10, 'the third waiter queued', fn () => 3 === \count(queue($c, $name)['waiters']));
        // The first waiter dies while it waits.
        $w1->kill();
        eventually(10, "the killed waiter's wait withdrawn", fn () => 2 === \count(queue($c, $name)['waiters']));
        $h->send('release');
        $h->expect('RELEASED');
        // The second is granted, and dies at once.
        $w2->expect('GRANTED', 10);
        $killed = microtime(true);
        $w2->kill();
        $w3->expect('GRANTED', 10);
        $took[] = microtime(true) - $killed;
        check(end($took) < 10, sprintf('the third waiter granted %.2f s after the second died holding it', end($took)));
        $w3->send('release');
        $w3->expect('RELEASED');
        foreach ([$h, $w1, $w2, $w3] as $w) {
            $w->close();
        }
    }
    printf("     a waiter SIGKILLed just after its grant (ttl 30 s) to the next waiter's grant: %s s, median %.2f s\n",
        implode(', ', array_map(fn ($t) => sprintf('%.2f', $t), $took)), median($took));
}

// The three states: a holder that makes no client call for longer than
// the grace (but less than the ttl) is in jeopardy (not held, not lost),
// held again after its next call renews, and lost once the cluster has
// revoked its session.
function test_jeopardy_client(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('jeopardy');
    $r = $c->lock($name, 30000, 0);
    check($r['acquired'], 'acquired');
    $s = $r['session_id'];
    checkSame('held', $c->state($s), 'state right after the lock');
    // No client call now (state() sends nothing): the count runs out.
    $t = microtime(true);
    eventually(10, 'the lock in jeopardy', fn () => 'jeopardy' === $c->state($s));
    printf("     held -> jeopardy after %.2f s without a call\n", microtime(true) - $t);
    checkSame([$s], rawHolders($cl, $name), 'the cluster still has the holder');
    check($c->isHeld($s), 'isHeld() renews and answers true');
    checkSame('held', $c->state($s), 'state after the renewal');
    // A session the cluster revokes is lost at its next renewal. The revoke
    // answers once the session's lease has run out (up to its ttl), so
    // another process sends it.
    $revoker = new Worker(['revoke', $cl->leader(), (string) $s]);
    eventually(40, 'the lock lost after the revoke', fn () => !$c->isHeld($s) && 'lost' === $c->state($s));
    checkSame('lost', $c->state($s), 'lost is final');
    $revoker->close();
    $c->unlock($s);
}

function test_jeopardy_symfony(Cluster $cl): void
{
    $factory = new LockFactory(new RaftlockStore($cl->endpoints()));
    $name = name('jeopardy-sf');
    $lock = $factory->createLock($name, 30);
    check($lock->acquire(), 'acquire');
    check(!$lock->isExpired() && $lock->getRemainingLifetime() > 0, 'not expired right after acquire()');
    // No call into the store: the Key's lifetime runs out (isExpired()
    // does not call the store).
    eventually(10, 'the Key expired (jeopardy)', fn () => $lock->isExpired());
    check(1 === \count(rawHolders($cl, $name)), 'the cluster still has the holder');
    check($lock->isAcquired(), 'isAcquired() renews and answers true');
    check(!$lock->isExpired() && $lock->getRemainingLifetime() > 0, 'not expired after isAcquired()');
    eventually(10, 'the Key expired again', fn () => $lock->isExpired());
    $lock->refresh();
    check(!$lock->isExpired(), 'not expired after refresh()');
    $lock->release();
    checkSame([], rawHolders($cl, $name), 'released');
}

// PHP-FPM's life cycle, in PHP's built-in web server (one process that
// serves request after request, freeing each request's objects at its
// end): a lock a request took and forgot to release is freed a grace
// after that request ends, while the process lives on.
function test_request_end_frees_a_forgotten_lock(Cluster $cl): void
{
    $port = Cluster::freeBase(1);
    $log = tempnam(sys_get_temp_dir(), 'raftlock-php-server-');
    $server = proc_open([\PHP_BINARY, '-S', "127.0.0.1:$port", __DIR__.'/request.php'], [0 => ['file', '/dev/null', 'r'], 1 => ['file', $log, 'a'], 2 => ['file', $log, 'a']], $pipes, null, ['RAFTLOCK_ENDPOINTS' => $cl->endpoints()] + getenv());
    try {
        $get = fn (string $q) => @file_get_contents("http://127.0.0.1:$port/?$q", false, stream_context_create(['http' => ['timeout' => 20]]));
        eventually(10, 'the web server up', fn () => 'pid '.proc_get_status($server)['pid'] === $get('pid'));
        $name = name('forgotten');
        $answer = (string) $get('forget='.urlencode($name));
        check(str_starts_with($answer, 'held session '), "the request's answer: $answer");
        $ended = microtime(true);
        $r = (new Client($cl->endpoints()))->lock($name, 30000, 10000);
        $took = microtime(true) - $ended;
        check($r['acquired'], sprintf('the forgotten lock not freed within 10 s of the end of the request (%.2f s)', $took));
        printf("     a lock forgotten by a request freed %.2f s after the request ended\n", $took);
        check(proc_get_status($server)['running'], 'the server process still runs');
        checkSame('pid '.proc_get_status($server)['pid'], $get('pid'), 'the same process answers the next request');
        (new Client($cl->endpoints()))->unlock($r['session_id']);
    } finally {
        proc_terminate($server, 9);
        proc_close($server);
        unlink($log);
    }
}

// Under PHP-FPM (issue 44, item 1): a worker SIGKILLed while a request
// holds a lock at the client's defaults (ttl 30 s) frees it a grace
// later, not a ttl later: the request's keep-alive stream, a transfer left
// open in curl_multi, ends with the process. Three rounds through a real
// php-fpm pool of one worker; prints the kill-to-grant times.
function test_php_fpm_worker_killed_frees_its_lock(Cluster $cl): void
{
    $binary = Fpm::binary();
    if (null === $binary) {
        check(false === getenv('RAFTLOCK_REQUIRE_SERVERS'), 'php-fpm is not installed (Debian: php-fpm)');
        echo "     skipped: php-fpm is not installed (Debian: php-fpm)\n";

        return;
    }
    $fpm = new Fpm($binary);
    try {
        $c = new Client($cl->endpoints());
        $took = [];
        foreach (range(1, 3) as $round) {
            $name = name("fpm-killed-$round");
            $conn = $fpm->get(__DIR__.'/fpm-hold.php', 'name='.urlencode($name), ['RAFTLOCK_ENDPOINTS' => $cl->endpoints()]);
            $pid = null;
            while (null !== ($line = $fpm->readLine($conn, 20))) {
                if (preg_match('/^HELD pid (\d+)$/', $line, $m)) {
                    $pid = (int) $m[1];
                    break;
                }
                check(!str_starts_with($line, 'NOT ACQUIRED'), 'the FPM request took the lock');
            }
            check(null !== $pid, 'the FPM request said it holds the lock; php-fpm: '.$fpm->log());
            check(1 === \count(queue($c, $name)['holders']), 'the FPM worker holds the lock');
            $killed = microtime(true);
            posix_kill($pid, 9);
            $r = $c->lock($name, 30000, 20000);
            $took[] = microtime(true) - $killed;
            check($r['acquired'], sprintf('the killed worker\'s lock not freed within 20 s (%.2f s)', end($took)));
            check(end($took) < 10, sprintf('granted %.2f s after the kill', end($took)));
            $c->unlock($r['session_id']);
            fclose($conn);
            // php-fpm starts a new worker for the next round.
        }
        printf("     PHP-FPM worker SIGKILLed while holding (ttl 30 s) to the next grant: %s s, median %.2f s\n",
            implode(', ', array_map(fn ($t) => sprintf('%.2f', $t), $took)), median($took));
    } finally {
        $fpm->stop();
    }
}

// A long-lived process (a queue consumer, a worker-mode server) that
// forgot a lock and goes on using the client: the stream renews the
// forgotten session for a ttl after its last use, then stops, and the
// cluster ends it a ttl later.
function test_a_forgotten_lock_in_a_long_lived_process_ends(Cluster $cl): void
{
    $c = new Client($cl->endpoints());
    $name = name('forgotten-long');
    $r = $c->lock($name, 2000, 0);
    check($r['acquired'], 'acquired');
    $t = microtime(true);
    // Other work: a call into the client every 20 ms.
    eventually(20, 'the forgotten lock freed', fn () => [] === queue($c, $name)['holders']);
    $took = microtime(true) - $t;
    printf("     a lock (ttl 2 s) forgotten in a process that goes on calling the client freed after %.2f s\n", $took);
    check($took > 2.0, sprintf('renewed for its ttl after its last use (freed after %.2f s)', $took));
    checkSame('lost', $c->state($r['session_id']), 'its state');
}

// A lock granted after a wait longer than its ttl (ttl 2 s, a 2.5 s
// wait; the node keeps a waiting session alive) is held in the session
// that waited: the grant is the next fence, and lock() returns it held.
// With the grace (750 ms) and without it (0).
function test_a_grant_after_a_long_wait_is_held(Cluster $cl): void
{
    $c = new Client($cl->endpoints(), null, ['end_on_disconnect_ms' => 0]);
    foreach ([750, 0] as $grace) {
        $name = name("long-wait-$grace");
        $h = $c->lock($name, 30000, 0);
        check($h['acquired'], 'the holder');
        $w = new Worker(['wait-ttl', $cl->endpoints(), $name, '2000', (string) $grace]);
        $w->expect('WAITING');
        $queued = 0;
        eventually(10, 'the waiter queued', function () use ($c, $name, &$queued) {
            $waiters = queue($c, $name)['waiters'];
            $queued = (int) ($waiters[0]['session_id'] ?? 0);

            return 1 === \count($waiters);
        });
        $t = microtime(true);
        eventually(10, 'the waiter still queued 2.5 s later', fn () => microtime(true) - $t > 2.5 && 1 === \count(queue($c, $name)['waiters']));
        $c->unlock($h['session_id']);
        $line = $w->expect('GRANTED ', 15);
        checkSame(sprintf('GRANTED session %d fence %d acquired true state held', $queued, $h['fence'] + 1), $line, "grace $grace ms: the waiter's grant");
        checkSame([$queued], rawHolders($cl, $name), "grace $grace ms: the holders");
        $w->send('release');
        $w->expect('RELEASED');
    }
}

/** CPU seconds this process used so far, and its voluntary context switches (its waits that slept). */
function usage(): array
{
    $u = getrusage();

    return [$u['ru_utime.tv_sec'] + $u['ru_utime.tv_usec'] / 1e6 + $u['ru_stime.tv_sec'] + $u['ru_stime.tv_usec'] / 1e6, (int) $u['ru_nvcsw']];
}

// A call that waits never spins: isHeld() on a session whose stream
// cannot connect (every endpoint refuses) sleeps between its attempts, and
// a blocking lock() that outlasts another session's renewal window (the
// stream renews a session for a ttl after its last use) waits in long
// sleeps, not 1 ms ones. Figures: the CPU and the wake-ups of each wait,
// per second of waiting. A wait that sleeps 1 ms at a time wakes about
// 800 times a second (1,591 times in a 2 s wait, measured), one that
// spins without sleeping uses most of a CPU second per second; a wait as
// it should be wakes a few tens of times a second (a 50 ms poll and the
// stream's renewals; 11 to 53 measured) and uses a few hundredths of a
// CPU second. The bounds, 100 wake-ups and 0.2 s of CPU per second, are
// about an order of magnitude below a 1 ms loop and a fifth of a spin.
function test_waits_do_not_spin(Cluster $cl): void
{
    // No node: the stream's connection is refused at once, again and again.
    $nowhere = new Client('127.0.0.1:'.Cluster::freeBase(1), null, ['retry_timeout' => 2.0]);
    $nowhere->track(4242, 30000, 750);
    [$cpu, $wakes] = usage();
    $t = microtime(true);
    check(!$nowhere->isHeld(4242), 'isHeld() with no node');
    [$cpu2, $wakes2] = usage();
    $took = microtime(true) - $t;
    $spent = $cpu2 - $cpu;
    printf("     isHeld() with every endpoint refusing: %.2f s, %.2f s of CPU (%.3f per s), %d wake-ups (%.0f per s)\n",
        $took, $spent, $spent / $took, $wakes2 - $wakes, ($wakes2 - $wakes) / $took);
    check($spent / $took < 0.2, sprintf('isHeld() used %.2f s of CPU in %.2f s (a busy loop)', $spent, $took));
    check(($wakes2 - $wakes) / $took < 100, sprintf('isHeld() woke %d times in %.2f s (short sleeps)', $wakes2 - $wakes, $took));

    // A session (ttl 4 s) renewed by the stream while other calls run,
    // then left alone past its renewal window; then a blocking lock().
    $c = new Client($cl->endpoints());
    $other = name('spin-b');
    $h = new Worker(['hold', $cl->endpoints(), $other]);
    $h->expect('HELD');
    $r = $c->lock(name('spin-a'), 4000, 0);
    check($r['acquired'] && $c->keepAlive($r['session_id']), 'acquired and renewed');
    $t = microtime(true);
    while (microtime(true) < $t + 3.4) {
        $c->describe($other); // other work: the stream renews the session meanwhile
        usleep(20000);
    }
    time_sleep_until($t + 4.2); // application code, no call: past the window
    check('lost' !== $c->state($r['session_id']), 'not lost: '.$c->state($r['session_id']));
    [$cpu, $wakes] = usage();
    $t = microtime(true);
    check(!$c->lock($other, 30000, 2000)['acquired'], 'a lock held by another');
    [$cpu2, $wakes2] = usage();
    $took = microtime(true) - $t;
    printf("     a 2 s lock() wait past a session's renewal window: %.2f s, %.2f s of CPU (%.3f per s), %d wake-ups (%.0f per s)\n",
        $took, $cpu2 - $cpu, ($cpu2 - $cpu) / $took, $wakes2 - $wakes, ($wakes2 - $wakes) / $took);
    check(($cpu2 - $cpu) / $took < 0.2, sprintf('the wait used %.2f s of CPU in %.2f s (a busy loop)', $cpu2 - $cpu, $took));
    check(($wakes2 - $wakes) / $took < 100, sprintf('the wait woke %d times in %.2f s (short sleeps)', $wakes2 - $wakes, $took));
    $c->unlock($r['session_id']);
    $h->send('release');
    $h->expect('RELEASED');
}

// A wait while the stream left for silence has ended (its node closed
// it) and no newer stream renews (a stand-in node: stream 1 answers until
// told to go silent, and is closed when stream 2 connects; every later
// stream is closed at once): the finished stream must not make the waits
// spin (a curl_multi_select on finished transfers alone returns at once).
// Figures: the CPU and the wake-ups per second of the wait.
function test_a_finished_stale_stream_does_not_make_waits_spin(Cluster $unused): void
{
    $node = new StandIn('hangup');
    $c = new Client($node->endpoint(), null, ['retry_timeout' => 4.0]);
    $c->track(7, 30000, 750);
    check($c->isHeld(7), 'held while stream 1 answers');
    $node->send('silent');
    [$cpu, $wakes] = usage();
    $t = microtime(true);
    check(!$c->isHeld(7), 'held with nothing answering');
    [$cpu2, $wakes2] = usage();
    $took = microtime(true) - $t;
    $ev = $node->events();
    printf("     isHeld() for %.2f s past a finished stale stream: %.2f s of CPU (%.2f per s), %d wake-ups (%.0f per s); events %s\n",
        $took, $cpu2 - $cpu, ($cpu2 - $cpu) / $took, $wakes2 - $wakes, ($wakes2 - $wakes) / $took, implode(', ', $ev));
    check(\in_array('closed 1', $ev, true), 'the stand-in closed stream 1');
    check(($cpu2 - $cpu) / $took < 0.2, sprintf('the wait used %.2f s of CPU in %.2f s (a busy loop)', $cpu2 - $cpu, $took));
    check(($wakes2 - $wakes) / $took < 100, sprintf('the wait woke %d times in %.2f s (short sleeps)', $wakes2 - $wakes, $took));
    check('lost' !== $c->state(7), 'lost');
}

// isAcquired() (the stores' exists()) when its CheckFence answers late:
// here the process stalls 0.9 s in it (longer than the 675 ms the count
// believes a renewal), as on a busy machine. The lock is held all along,
// so isAcquired() answers true and the Key is not expired.
function test_is_acquired_with_a_slow_check_fence(Cluster $cl): void
{
    $slow = false;
    $client = new Client($cl->endpoints(), null, ['curl' => [
        \CURLOPT_NOPROGRESS => false,
        \CURLOPT_XFERINFOFUNCTION => function ($ch) use (&$slow): int {
            if ($slow && str_contains((string) curl_getinfo($ch, \CURLINFO_EFFECTIVE_URL), 'CheckFence')) {
                $slow = false;
                usleep(900000); // the process stalls in this CheckFence
            }

            return 0;
        },
    ]]);
    $lock = (new LockFactory(new RaftlockStore($client)))->createLock(name('slow-fence'), 30);
    check($lock->acquire(), 'acquire');
    $slow = true;
    check($lock->isAcquired(), 'isAcquired() with a CheckFence that took 0.9 s');
    check(!$slow, 'the CheckFence was slowed');
    check(!$lock->isExpired(), 'not expired after isAcquired()');
    $lock->release();

    $semaphore = (new SemaphoreFactory(new RaftlockSemaphoreStore($client)))->createSemaphore(name('slow-fence-sem'), 2, 1, 30);
    check($semaphore->acquire(), 'acquire a permit');
    $slow = true;
    check($semaphore->isAcquired(), 'the semaphore\'s isAcquired() with a CheckFence that took 0.9 s');
    check(!$slow, 'the CheckFence was slowed');
    $semaphore->release();
}

// The stream breaks when its leader dies: the next call opens it again on
// the new leader and renews there, and the lock is held again, never lost.
function test_the_stream_follows_a_new_leader(Cluster $unused): void
{
    $nodes = new NodeProcesses();
    try {
        $c = new Client($nodes->endpoints());
        $r = $c->lock(name('stream-failover'), 30000, 0);
        check($r['acquired'] && $c->isHeld($r['session_id']), 'held before the failover');
        $nodes->kill($nodes->leaderId());
        $t = microtime(true);
        eventually(30, 'held again after the failover', fn () => $c->isHeld($r['session_id']));
        printf("     held again %.2f s after the leader was killed\n", microtime(true) - $t);
        checkSame('held', $c->state($r['session_id']), 'the state after the failover');
        checkSame(1, $c->unlock($r['session_id']), 'released on the new leader');
    } finally {
        $nodes->stop();
    }
}

// A leader that hangs (SIGSTOP: its connections stay open, nothing is
// answered): the stream leaves it and renews on the new leader before the
// ttl count (ttl 30 s: 27 s; an election takes a few seconds) runs out,
// so the lock is never lost.
function test_the_stream_leaves_a_hung_leader(Cluster $unused): void
{
    $nodes = new NodeProcesses();
    try {
        $c = new Client($nodes->endpoints());
        $name = name('stream-hung-leader');
        $r = $c->lock($name, 30000, 0);
        $s = $r['session_id'];
        check($r['acquired'] && $c->isHeld($s), 'held before the leader hangs');
        $nodes->signal($nodes->leaderId(), \SIGSTOP);
        $t = microtime(true);
        eventually(30, 'held again after the leader hung', function () use ($c, $s, $t) {
            $held = $c->isHeld($s);
            check('lost' !== $c->state($s), sprintf('the lock lost %.2f s after the leader hung', microtime(true) - $t));

            return $held;
        });
        printf("     held again %.2f s after the leader was stopped\n", microtime(true) - $t);
        // The Unlock's first attempt goes to the hung node (the Client's
        // last leader) and times out after 5 s; then the new leader
        // releases it.
        $c->unlock($s);
        checkSame([], queue($c, $name)['holders'], 'nothing held after the unlock');
    } finally {
        $nodes->stop();
    }
}

// Two silences in a row (a stand-in node: stream 1 answers its first ask
// only, its replacement 2 nothing, stream 3 everything): stream 1, which
// carried the session, stays open until a successor (stream 3) has
// renewed; closing it earlier would start the leader's grace with no
// stream renewing the session.
function test_the_oldest_silent_stream_stays_open_until_a_successor_renews(Cluster $unused): void
{
    $node = new StandIn('silences');
    $c = new Client($node->endpoint());
    $c->track(7, 30000, 750);
    eventually(60, 'stream 3 answered and stream 1 closed', function () use ($c, $node): bool {
        $c->isHeld(7);
        $ev = $node->events();

        return \in_array('answer 3', $ev, true) && \in_array('closed 1', $ev, true);
    });
    $ev = $node->events();
    printf("     events %s\n", implode(', ', $ev));
    check(array_search('closed 1', $ev, true) > array_search('answer 3', $ev, true),
        'events '.implode(', ', $ev).': stream 1 closed before any successor renewed (want it open until stream 3 answered)');
    check('lost' !== $c->state(7), 'lost');
}

// The silence after which the stream leaves its node is the grace, at
// most a third of the ttl, and at least 1 s, as in the Go and Python
// clients. With a grace as long as the ttl (30 s, a stand-in node whose
// stream 1 stops answering, stream 2 answers) the stream is replaced
// after 10 s, long before the ttl count (27 s) runs out: never lost.
function test_the_silence_is_at_most_a_third_of_the_ttl(Cluster $unused): void
{
    $node = new StandIn('one');
    $c = new Client($node->endpoint());
    $c->track(7, 30000, 30000);
    check($c->isHeld(7), 'held while stream 1 answers');
    $node->send('silent');
    $t = microtime(true);
    eventually(60, 'a renewal on stream 2', function () use ($c, $node, $t): bool {
        $held = $c->isHeld(7);
        check('lost' !== $c->state(7), sprintf('lost %.2f s after stream 1 went silent, before a new stream renewed (events %s)', microtime(true) - $t, implode(', ', $node->events())));

        return $held && \in_array('answer 2', $node->events(), true);
    });
    printf("     held on stream 2 %.2f s after stream 1 went silent; events %s\n", microtime(true) - $t, implode(', ', $node->events()));
}

// ---- the client: leaders, failures, limits, credentials ----

function test_follows_the_leader_past_dead_nodes_and_followers(Cluster $cl): void
{
    $leader = $cl->leader();
    $followers = array_values(array_filter($cl->nodes, fn ($a) => $a !== $leader));
    $dead = @stream_socket_server('tcp://127.0.0.1:0');
    $deadAddr = stream_socket_get_name($dead, false);
    fclose($dead);
    $store = new RaftlockStore("http://$deadAddr,".implode(',', $followers));
    $lock = (new LockFactory($store))->createLock(name('follow'));
    check($lock->acquire(), 'acquire through a dead node and followers');
    $lock->release();
}

// Nodes that refuse the connection or whose names do not resolve cannot
// have taken the request: the client gives up at once (every endpoint
// three rounds in a row), as every raftlock client does, rather than
// retrying for its 15 s (the seed-user walk of 2026-11-29 waited it out).
function test_no_node_answering_gives_up_naming_the_nodes(Cluster $cl): void
{
    $dead = @stream_socket_server('tcp://127.0.0.1:0');
    $deadAddr = stream_socket_get_name($dead, false);
    fclose($dead);
    $c = new Client("$deadAddr,no-such-host.invalid:7101");
    $started = microtime(true);
    $e = checkThrows(RaftlockException::class, "no node accepts connections (each refused or did not resolve every attempt): http://$deadAddr: connection refused; http://no-such-host.invalid:7101: the name does not resolve (", fn () => $c->lock(name('down'), 10000));
    $took = microtime(true) - $started;
    check($took < 12.0, "gave up after $took s, not at once");
    checkSame('UNAVAILABLE', $e->getStatus(), 'status');
    check($e->isUnreachable(), 'nothing was sent: isUnreachable()');
    // A node's own UNAVAILABLE (no leader) is not.
    check(!(new RaftlockException('UNAVAILABLE', 'no leader', 503))->isUnreachable(), 'an answer is not unreachable');
    $lock = (new LockFactory(new RaftlockStore($c)))->createLock(name('down'));
    checkThrows(LockAcquiringException::class, 'Failed to acquire', fn () => $lock->acquire());
}

/**
 * Endpoints that do not serve the call: another web service on a dead
 * node's port (its 404 page), a raftlock without this route (an older
 * version during an upgrade: 404 "no route"), a server answering 501.
 *
 * @return list<Unserving>
 */
function unserving(): array
{
    return [
        new Unserving(404, 'text/html', '<html>404 Not Found</html>'),
        new Unserving(404, 'application/json', '{"code":"NOT_FOUND","message":"no route POST /v1/locks/Lock"}'),
        new Unserving(501, 'text/plain', 'Not Implemented'),
    ];
}

// Nothing was done at such an endpoint, so the client asks the others, as
// the Rust client does with UNIMPLEMENTED.
function test_an_endpoint_that_does_not_serve_the_call_is_passed_over(Cluster $cl): void
{
    $standIns = unserving();
    $eps = array_map(fn (Unserving $u) => $u->endpoint(), $standIns);
    $c = new Client(implode(',', $eps).','.$cl->endpoints());
    $r = $c->lock(name('unserved'), 10000);
    check($r['acquired'], 'the lock, through endpoints that do not serve the call');
    $c->unlock($r['session_id']);
    foreach ($standIns as $i => $u) {
        check($u->asked() > 0, "stand-in $i was never asked: the test does not test the pass-over");
    }
}

// When none serves it, the call fails with UNIMPLEMENTED once each has
// answered so, naming each, not after the retry timeout.
function test_no_endpoint_serves_the_call_fails_with_unimplemented(Cluster $unused): void
{
    $standIns = unserving();
    $eps = array_map(fn (Unserving $u) => $u->endpoint(), $standIns);
    $c = new Client(implode(',', $eps), null, ['retry_timeout' => 600.0]);
    $e = checkThrows(RaftlockException::class, 'no endpoint serves locks/Lock: ', fn () => $c->lock(name('unserved'), 10000));
    checkSame('UNIMPLEMENTED', $e->getStatus(), 'status');
    check(!$e->isUnreachable(), 'the endpoints answered: not isUnreachable()');
    foreach ($standIns as $u) {
        check(str_contains($e->getMessage(), $u->endpoint()), "the error names {$u->endpoint()}: {$e->getMessage()}");
        checkSame(1, $u->asked(), "calls to {$u->endpoint()}");
    }
}

// A raftlock NOT_FOUND that is not "no route" (a session that is gone) is
// the cluster's answer: thrown at once, the other endpoints not asked.
function test_a_session_not_found_is_not_passed_over(Cluster $unused): void
{
    $gone = new Unserving(404, 'application/json', '{"code":"NOT_FOUND","message":"session 7 not found"}');
    $other = new Unserving(404, 'text/html', '<html>404 Not Found</html>');
    $c = new Client($gone->endpoint().','.$other->endpoint());
    $e = checkThrows(RaftlockException::class, 'session 7 not found', fn () => $c->lock(name('gone'), 10000));
    checkSame('NOT_FOUND', $e->getStatus(), 'status');
    checkSame(0, $other->asked(), 'calls to the other endpoint');
}

function test_bad_input_is_refused_clearly(Cluster $cl): void
{
    foreach (['', ' , ', 'ftp://127.0.0.1:1', '127.0.0.1', 'http://127.0.0.1:1/path'] as $eps) {
        checkThrows(\InvalidArgumentException::class, 'raftlock', fn () => new Client($eps));
    }
    checkThrows(\InvalidArgumentException::class, 'unknown options', fn () => new Client('127.0.0.1:1', null, ['retry' => 1]));
    // The ttl limits, at their edges (Client::MIN_TTL_MS, MAX_TTL_MS).
    new RaftlockStore('127.0.0.1:1', null, 1.0);
    new RaftlockStore('127.0.0.1:1', null, 3600.0);
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => new RaftlockStore('127.0.0.1:1', null, 0.999));
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => new RaftlockStore('127.0.0.1:1', null, 3600.001));
    $c = new Client($cl->endpoints());
    $factory = new LockFactory(new RaftlockStore($c));
    $lock = $factory->createLock(name('ttl'), 0.5);
    checkThrows(InvalidTtlException::class, '1 to 3600 seconds', fn () => $lock->acquire());
    // Client::MAX_NAME_BYTES, at its edge.
    $prefix = 'php-test/';
    $longest = $prefix.str_repeat('n', Client::MAX_NAME_BYTES - \strlen($prefix));
    $r = $c->lock($longest, 1000, 0);
    check($r['acquired'], 'a name of MAX_NAME_BYTES');
    $c->unlock($r['session_id']);
    checkThrows(\InvalidArgumentException::class, 'bytes of UTF-8', fn () => $c->lock($longest.'n', 1000));
    checkThrows(\InvalidArgumentException::class, 'bytes of UTF-8', fn () => $c->lock("php-test/\xff", 1000));
    checkThrows(LockAcquiringException::class, 'Failed to acquire', fn () => $factory->createLock($longest.'n')->acquire());
    checkThrows(\InvalidArgumentException::class, 'negative', fn () => $c->lock(name('neg'), 1000, -1));
    // The node's own refusal comes back with its code and HTTP status.
    $e = checkThrows(RaftlockException::class, 'capacity', fn () => $c->lock(name('cap'), 1000, 0, Client::SEMAPHORE, 1, Client::MAX_CAPACITY + 1));
    checkSame(['INVALID_ARGUMENT', 400], [$e->getStatus(), $e->getHttpStatus()], 'status of a capacity past the limit');
    $sem = (new SemaphoreFactory(new RaftlockSemaphoreStore($c)))->createSemaphore(name('cap'), Client::MAX_CAPACITY, Client::MAX_CAPACITY);
    check($sem->acquire(), 'a semaphore of MAX_CAPACITY');
    $sem->release();
    checkThrows(SemaphoreRuntimeException::class, 'Failed to acquire', fn () => (new SemaphoreFactory(new RaftlockSemaphoreStore($c)))->createSemaphore(name('cap'), Client::MAX_CAPACITY + 1)->acquire());
    checkSame(0, $c->unlock(987654321), 'unlock of an unknown session');
}

function test_token(Cluster $unused): void
{
    $acl = tempnam(sys_get_temp_dir(), 'raftlock-acl-');
    file_put_contents($acl, <<<'TOML'
        peer_token = "php-suite-peer-token-0123456789"
        [[token]]
        identity = "app"
        token = "app-token"
        [[rule]]
        identity = "app"
        allow = "lock"
        prefix = "app/"
        TOML);
    $cl = new Cluster(['--acl-file', $acl]);
    try {
        $lock = (new LockFactory(new RaftlockStore($cl->endpoints(), 'app-token')))->createLock('app/'.bin2hex(random_bytes(4)));
        check($lock->acquire(), 'acquire with the token');
        $lock->release();
        $e = checkThrows(RaftlockException::class, 'UNAUTHENTICATED', fn () => (new LockFactory(new RaftlockStore($cl->endpoints())))->createLock('app/x')->acquire());
        checkSame(401, $e->getHttpStatus(), 'HTTP status without a token');
        $e = checkThrows(RaftlockException::class, 'PERMISSION_DENIED', fn () => (new Client($cl->endpoints(), 'app-token'))->lock('other/x', 1000));
        checkSame(403, $e->getHttpStatus(), 'HTTP status outside the rule');
    } finally {
        $cl->stop();
        unlink($acl);
    }
}

// ---- the README ----

/** The fenced blocks of client/php/README.md in LANG, in order. */
function readmeBlocks(string $lang): array
{
    preg_match_all('/^```'.$lang.'\n(.*?)^```$/ms', file_get_contents(__DIR__.'/../README.md'), $m);

    return $m[1];
}

/**
 * Runs $script in a PHP process of its own; its exit status and its output lines.
 *
 * @return array{0: int, 1: list<string>}
 */
function runPhp(string $script): array
{
    $file = tempnam(sys_get_temp_dir(), 'raftlock-readme-');
    file_put_contents($file, $script);
    try {
        exec(escapeshellarg(\PHP_BINARY).' '.escapeshellarg($file).' 2>&1', $out, $status);
    } finally {
        unlink($file);
    }

    return [$status, $out];
}

// The README's "Install and a first lock" is under ten lines, and it and
// the Client example run as written (in a process of their own, against
// this cluster), take their locks and give them back.
function test_readme_first_lock_and_client_example(Cluster $cl): void
{
    [$install] = readmeBlocks('sh');
    $php = readmeBlocks('php');
    $lines = fn (string $b) => \count(array_filter(explode("\n", $b), fn ($l) => '' !== trim($l)));
    check($lines($install) + $lines($php[0]) < 10, 'install and first lock in under ten lines: '.($lines($install) + $lines($php[0])));
    $client = array_values(array_filter($php, fn ($b) => str_contains($b, 'new Raftlock\Client(')))[0];
    $lockAll = array_values(array_filter($php, fn ($b) => str_contains($b, '->lockAll(')))[0];
    $script = "<?php\nfunction work(\$fence) { echo 'work ', json_encode(\$fence, JSON_UNESCAPED_SLASHES), \"\\n\"; }\n".$php[0].$client.$lockAll;
    $script = str_replace("'/path/to/raftlock/client/php/autoload.php'", var_export(\dirname(__DIR__).'/autoload.php', true), $script);
    $script = str_replace('/* work */', 'echo "locked\n";', $script);
    $script = preg_replace("/'http:\\/\\/10\\.0\\.0\\.[^']*'/", var_export($cl->endpoints(), true), $script, -1, $endpoints);
    checkSame(2, $endpoints, 'endpoint lists replaced');
    [$status, $out] = runPhp($script);
    checkSame(0, $status, 'exit status of the README example ('.implode(' | ', $out).')');
    checkSame('locked', $out[0] ?? null, 'the first lock held');
    check(1 === preg_match('/^work [1-9][0-9]*$/', $out[1] ?? ''), 'the Client example worked under a fence: '.implode(' | ', $out));
    check(1 === preg_match('#^work \{"order/17":([1-9][0-9]*),"stock/42":([1-9][0-9]*)\}$#', $out[2] ?? '', $m) && (int) $m[2] === (int) $m[1] + 1,
        'the lockAll example worked under two consecutive fences: '.implode(' | ', $out));
    $c = new Client($cl->endpoints());
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'order/17'), 'order/17 after the example');
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'invoice-42'), 'invoice-42 after the example');
    checkSame(['holders' => [], 'waiters' => []], queue($c, 'tickets/42'), 'tickets/42 after the example');
}

// The README's fence-from-a-Key block (indented under its bullet) runs as
// written, after a $store of this cluster, and reads an int fence.
function test_readme_fence_from_a_key(Cluster $cl): void
{
    preg_match_all('/^  ```php\n(.*?)^  ```$/ms', file_get_contents(__DIR__.'/../README.md'), $m);
    $blocks = array_values(array_filter($m[1], fn ($b) => str_contains($b, 'createLockFromKey(')));
    checkSame(1, \count($blocks), 'the README shows one createLockFromKey block');
    $block = preg_replace('/^  /m', '', $blocks[0]);
    $script = "<?php\nrequire ".var_export(\dirname(__DIR__).'/autoload.php', true).";\n"
        .'$store = new Raftlock\Symfony\RaftlockStore('.var_export($cl->endpoints(), true).");\n"
        .$block
        .'echo json_encode($fence), "\n"; $lock->release();'."\n";
    [$status, $out] = runPhp($script);
    checkSame(0, $status, 'exit status of the README block ('.implode(' | ', $out).')');
    check(1 === preg_match('/^[1-9][0-9]*$/', $out[0] ?? ''), 'an int fence: '.implode(' | ', $out));
    checkSame(['holders' => [], 'waiters' => []], queue(new Client($cl->endpoints()), 'invoice-42'), 'invoice-42 after the block');
}

// ---- client/scenarios.json, as client/scenarios.md says ----

// Every scenario of the file the four clients share, in order, against a
// cluster of its own: three `raftlockd run` processes (kill_leader kills
// one of them).
function test_scenarios(Cluster $unused): void
{
    $nodes = new NodeProcesses();
    try {
        (new ScenarioRunner($nodes))->runFile(\dirname(__DIR__, 2).'/scenarios.json', function (string $name, float $took): void {
            printf("     scenario %s (%.2f s)\n", $name, $took);
        });
    } finally {
        $nodes->stop();
    }
}

// ---- the runner ----

$filter = $argv[1] ?? '';
$tests = array_values(array_filter(get_defined_functions()['user'], fn ($f) => str_starts_with($f, 'raftlock\\tests\\test_') && str_contains($f, $filter)));
$started = microtime(true);
$cluster = new Cluster();
$failed = [];
foreach ($tests as $test) {
    $short = substr($test, \strlen('raftlock\\tests\\'));
    $t = microtime(true);
    try {
        $test($cluster);
        printf("ok   %s (%.2f s)\n", $short, microtime(true) - $t);
    } catch (\Throwable $e) {
        $failed[] = $short;
        printf("FAIL %s (%.2f s): %s\n", $short, microtime(true) - $t, $e->getMessage());
        for ($p = $e->getPrevious(); null !== $p; $p = $p->getPrevious()) {
            printf("     caused by %s: %s\n", \get_class($p), $p->getMessage());
        }
        printf("     at %s:%d\n", $e->getFile(), $e->getLine());
    }
    gc_collect_cycles(); // end the workers of a test before the next
}
$cluster->stop();
printf("%d tests, %d failed, %.1f s\n", \count($tests), \count($failed), microtime(true) - $started);
exit($failed ? 1 : 0);
