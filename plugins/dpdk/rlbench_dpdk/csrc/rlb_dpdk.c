/* See rlb_dpdk.h for the model. Threading: one thread drives a listener (and its links), one thread
 * drives each client link; slot allocation and port hot-plug are serialised by g_lock. */
#define _GNU_SOURCE
#include "rlb_dpdk.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <time.h>
#include <rte_alarm.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_interrupts.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>
#include <rte_version.h>

#define MAX_PORTS 64
#define MAX_LINKS 256
#define MAX_LISTENERS 16
#define WINDOW 128          /* unacknowledged frames per link */
#define BURST 32
#define POOL_MBUFS 6143
#define MBUF_ROOM 9216      /* largest frame we build: jumbo where the port allows */
#define RLB_MAGIC 0x4c52
#define RLB_VERSION 1
#define RLB_UDP_PORT 47474
#define SPIN_POLLS 200      /* pure empty polls (~5-10 us): a ping-pong's reply comes within them */
#define YIELD_EVERY 32      /* then a sched_yield() every this many polls ... */
#define YIELDS 200          /* ... this many times before sleeping (a replay node's reply comes within) */
#define MAX_SLEEP_NS 100000
#define DELAYED_ACK_NS 20000
#define LINK_CHECK_NS 10000000ull
#define BYE_WAIT_NS 200000000ull
#define PORT_LINGER_NS 20000000ull  /* a retired port is closed once its teardown is long over */
#define PORT_LINGER_MAX_NS 5000000000ull
#define ASM_FIRST 65536     /* a message's reassembly buffer starts this large (or at its length) and doubles */
#define ACK_POLLS 16        /* rx bursts a listener's send takes, at most, when the peer's window is full */

enum { S_MSENT, S_MRECV, S_BSENT, S_BRECV, S_LOST, S_FSENT, S_FRECV, S_RETX, S_ACKS, S_GAPS, S_DUPS, S_OOO,
       S_MALFORMED, S_TXFULL, S_REFUSED, S_DROPPED, S_REFUSED_PEERS, S_SLOW };

struct rlb_hdr {
    uint16_t magic;
    uint8_t version, kind;
    uint32_t conn;     /* connection id, chosen at random by the connecting side */
    uint32_t token;    /* the listener's token (HELLO) */
    uint32_t fseq;     /* DATA: this frame's sequence number on the link */
    uint32_t ack;      /* every frame: the next frame sequence number its sender expects */
    uint32_t msg_len;  /* DATA: bytes in the whole message */
    uint32_t offset;   /* DATA: where this fragment's bytes go in the message */
    uint16_t len;      /* DATA: bytes in this fragment */
    uint8_t flags, pad;
} __attribute__((packed));

#define L2L4_LEN (sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr) + sizeof(struct rte_udp_hdr))
#define HDR_LEN (L2L4_LEN + sizeof(struct rlb_hdr))

struct msg {
    struct msg *next;
    uint32_t len, pad;  /* data starts 16-byte aligned, so received arrays can be viewed in place */
    uint8_t data[];
};

/* A message (or its rest) a listener's link could not frame yet: bytes [start, len) of a message of
 * `len` bytes, `off` the next byte to frame. */
struct pend {
    struct pend *next;
    uint32_t len, start, off, pad;
    uint8_t data[];
};

struct port {
    int used;
    uint16_t pid;
    struct rte_ether_addr mac;
    uint32_t mtu, payload, device_mtu;
    uint64_t opened_ns;
    int listener;     /* listener index, or -1 */
    int client_link;  /* the client link on this port, or -1 */
    int per_peer;     /* memif: the port carries one link, and ends with it */
    volatile int retired;  /* never polled again: see link_end */
    uint64_t retired_ns, down_ns;
};

struct link {
    int used, port, listener;
    int peer_id;           /* a listener's name for it: the slot, and how often the slot was used */
    uint32_t conn, token;
    uint32_t max_message;  /* longest message this side accepts */
    uint64_t give_up_ns;   /* a peer silent this long (unacknowledged frames, or mid-message) is gone */
    uint8_t out_flags;  /* F_TO_LISTENER on the client side */
    int connected, closed, bye_sent;
    struct rte_ether_addr peer_mac;
    uint32_t tx_next, tx_acked;
    struct rte_mbuf *hist[WINDOW];
    uint64_t last_tx_ns, last_progress_ns, last_retx_ns, rto;
    uint32_t rx_next, rx_unacked;
    uint64_t last_rx_ns, last_gap_ns, last_dup_ack_ns, last_heard_ns, last_bye_ns;
    struct msg *asm_msg;
    uint32_t asm_have, asm_cap;  /* bytes arrived, bytes the buffer holds */
    uint32_t refused_len;        /* the length of the message refused as too large */
    struct msg *q_head, *q_tail, *held;
    /* A listener's link: messages waiting for window room (out_bytes not yet framed), and frames in
     * the window from tx_sent on that the transmit ring did not take. `pending`: either is there. */
    struct pend *out_head, *out_tail;
    uint64_t out_bytes;
    uint32_t tx_sent;
    int pending;
    uint64_t st[RLB_STATS_N];
};

struct listener {
    int used;
    uint32_t token, max_message;
    uint64_t give_up_ns, max_queued;
    int ports[MAX_PORTS];
    volatile int nports;  /* grows from the accept thread while the owner polls */
    int links[MAX_LINKS];
    int nlinks, turn;
    int backlog;  /* links with pending set */
    struct msg *held;
    uint64_t counted[RLB_STATS_N];  /* counters of links that are gone, and of frames no link owns */
    uint64_t last_check_ns;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rte_mempool *g_pool;
static struct rte_mempool *g_small_pool;  /* AF_XDP's umem takes buffers of at most a page */
static int g_ready;
static __thread char g_err[512];
static struct port g_ports[MAX_PORTS];
static struct link g_links[MAX_LINKS];
static uint32_t g_link_uses[MAX_LINKS];
static struct listener g_listeners[MAX_LISTENERS];
static const uint64_t g_rto = 20000000ull;
static const struct rte_ether_addr g_dst_mac = {{0x02, 0x72, 0x6c, 0x62, 0x00, 0x01}};

static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof(g_err), fmt, ap);
    va_end(ap);
    return code < 0 ? code : -code;
}

const char *rlb_last_error(void) { return g_err; }
const char *rlb_version(void) { return rte_version(); }

uint64_t rlb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int seq_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

/* Time from `then` to `now`, 0 if `then` is later: a loop reads the clock once per pass, and what it
 * calls may stamp a link or port with a later reading (or another thread may, opening a port). A
 * plain `now - then` wrapped to ~2^64 there and read as "long ago": a port retired in that pass was
 * closed at once, its link still up, racing the memif PMD's teardown. */
static inline uint64_t since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

/* Poll, then poll with a yield every YIELD_EVERY polls, then sleep a little longer each time. The
 * early yields matter with more processes than cores: the process whose reply we wait for may need
 * this core, and a pure spinner would hold it for its whole time slice. */
static void idle_step(uint32_t *idle)
{
    static __thread int slack_set;
    uint32_t n = ++*idle;
    if (n < SPIN_POLLS) return;
    uint32_t yielding = SPIN_POLLS + YIELD_EVERY * YIELDS;
    if (n < yielding) {
        if ((n - SPIN_POLLS) % YIELD_EVERY == 0) sched_yield();
        return;
    }
    if (!slack_set) {  /* sleep what we ask, not the default 50 us more */
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        slack_set = 1;
    }
    uint64_t ns = 5000ull * (n - yielding + 1);
    struct timespec ts = {0, (long)(ns < MAX_SLEEP_NS ? ns : MAX_SLEEP_NS)};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------------------ set-up */
int rlb_init(const char *eal_args)
{
    static char buf[4096];
    char *argv[128];
    int argc = 0;
    if (g_ready) return 0;
    argv[argc++] = "rlbench-dpdk";
    snprintf(buf, sizeof(buf), "%s", eal_args ? eal_args : "");
    for (char *save = NULL, *t = strtok_r(buf, " \t\n", &save); t && argc < 127; t = strtok_r(NULL, " \t\n", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    if (rte_eal_init(argc, argv) < 0)
        return fail(rte_errno, "rte_eal_init failed: %s", rte_strerror(rte_errno));
    g_pool = rte_pktmbuf_pool_create("rlb_pool", POOL_MBUFS, 128, 0, MBUF_ROOM + RTE_PKTMBUF_HEADROOM, SOCKET_ID_ANY);
    if (!g_pool) return fail(rte_errno, "mbuf pool: %s (raise -m)", rte_strerror(rte_errno));
    for (int i = 0; i < MAX_PORTS; i++) g_ports[i].listener = g_ports[i].client_link = -1;
    g_ready = 1;
    return 0;
}

int rlb_port_count(void) { return g_ready ? (int)rte_eth_dev_count_avail() : 0; }

int rlb_port_info(int port, char *driver, int driver_cap, uint32_t *mtu, uint32_t *payload, int *link_up,
                  uint32_t *device_mtu)
{
    if (port < 0 || port >= MAX_PORTS || !g_ports[port].used) return fail(EINVAL, "no port %d", port);
    struct port *p = &g_ports[port];
    struct rte_eth_dev_info info;
    struct rte_eth_link link;
    memset(&link, 0, sizeof(link));
    if (rte_eth_dev_info_get(p->pid, &info) == 0) snprintf(driver, driver_cap, "%s", info.driver_name);
    rte_eth_link_get_nowait(p->pid, &link);
    *mtu = p->mtu;
    *payload = p->payload;
    *link_up = link.link_status;
    *device_mtu = p->device_mtu;
    return 0;
}

static int port_open_locked(const char *devargs, uint32_t want_mtu)
{
    char name[RTE_DEV_NAME_MAX_LEN];
    uint16_t pid;
    int slot = -1, ret;
    for (int i = 0; i < MAX_PORTS; i++) if (!g_ports[i].used) { slot = i; break; }
    if (slot < 0) return fail(EMFILE, "too many DPDK ports open (%d)", MAX_PORTS);
    snprintf(name, sizeof(name), "%.*s", (int)strcspn(devargs, ","), devargs);
    struct rte_mempool *pool = g_pool;
    if (strncmp(name, "net_af_xdp", 10) == 0) {
        if (!g_small_pool)
            g_small_pool = rte_pktmbuf_pool_create("rlb_small_pool", 4095, 128, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
        if (!g_small_pool) return fail(rte_errno, "af_xdp mbuf pool: %s (raise -m)", rte_strerror(rte_errno));
        pool = g_small_pool;
        if (want_mtu > 1500) want_mtu = 1500;
    }
    if (rte_eth_dev_get_port_by_name(name, &pid) != 0) {  /* not a NIC probed at start-up: hot-plug it */
        if ((ret = rte_dev_probe(devargs)) < 0) return fail(ret, "cannot create DPDK port %s: %s", devargs, rte_strerror(-ret));
        if (rte_eth_dev_get_port_by_name(name, &pid) != 0) return fail(ENODEV, "DPDK port %s did not appear after probing", name);
    }
    struct rte_eth_conf conf;
    struct rte_eth_dev_info info;
    memset(&conf, 0, sizeof(conf));
    if ((ret = rte_eth_dev_info_get(pid, &info)) < 0) return fail(ret, "%s: dev_info: %s", name, rte_strerror(-ret));
    if ((ret = rte_eth_dev_configure(pid, 1, 1, &conf)) < 0) return fail(ret, "%s: configure: %s", name, rte_strerror(-ret));
    uint32_t largest = (pool == g_pool ? MBUF_ROOM : RTE_MBUF_DEFAULT_DATAROOM) - RTE_ETHER_HDR_LEN;
    int memif = strncmp(name, "net_memif", 9) == 0;
    uint16_t device_mtu = 1500;
    if (!memif && want_mtu > 1500) {
        uint32_t m = want_mtu < largest ? want_mtu : largest;
        if (info.max_mtu && m > info.max_mtu) m = info.max_mtu;
        if (m > 1500) rte_eth_dev_set_mtu(pid, (uint16_t)m);
    }
    rte_eth_dev_get_mtu(pid, &device_mtu);
    /* memif's PMD has no MTU: rte_eth_dev_set_mtu answers ENOTSUP, and it reports a 1518-byte largest
     * frame, yet it copies any frame into a chain of descriptors (bsize bytes each) and back into mbufs
     * on the other side. Both ends are this shim, so on memif the MTU is ours to choose, up to what an
     * mbuf of our pool holds. Elsewhere it is the device's. */
    uint32_t mtu = memif && want_mtu ? (want_mtu < largest ? want_mtu : largest) : device_mtu;
    uint16_t nrx = 1024, ntx = 1024;
    rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrx, &ntx);
    int sock = rte_eth_dev_socket_id(pid);
    if ((ret = rte_eth_rx_queue_setup(pid, 0, nrx, sock, NULL, pool)) < 0) return fail(ret, "%s: rx queue: %s", name, rte_strerror(-ret));
    if ((ret = rte_eth_tx_queue_setup(pid, 0, ntx, sock, NULL)) < 0) return fail(ret, "%s: tx queue: %s", name, rte_strerror(-ret));
    if ((ret = rte_eth_dev_start(pid)) < 0) return fail(ret, "%s: start: %s", name, rte_strerror(-ret));
    rte_eth_promiscuous_enable(pid);
    struct port *p = &g_ports[slot];
    memset(p, 0, sizeof(*p));
    p->pid = pid;
    if (mtu > largest) mtu = largest;
    p->mtu = mtu;
    p->device_mtu = device_mtu;
    p->payload = mtu + RTE_ETHER_HDR_LEN - HDR_LEN;
    p->listener = p->client_link = -1;
    p->per_peer = memif;
    p->opened_ns = rlb_now_ns();
    rte_eth_macaddr_get(pid, &p->mac);
    p->used = 1;
    return slot;
}

int rlb_port_open(const char *devargs, uint32_t mtu)
{
    if (!g_ready) return fail(ENODEV, "EAL is not initialised");
    pthread_mutex_lock(&g_lock);
    int ret = port_open_locked(devargs, mtu);
    pthread_mutex_unlock(&g_lock);
    return ret;
}

static int port_link_down(const struct port *p)
{
    struct rte_eth_link link;
    memset(&link, 0, sizeof(link));
    return rte_eth_link_get_nowait(p->pid, &link) == 0 && !link.link_status;
}

/* Whether a memif port's link has been down for a while. The PMD tears a connection down on the
 * EAL interrupt thread when the other process leaves (link down first, then unmapping the rings and
 * unregistering callbacks), with no lock against this thread's rx bursts; a port is polled again
 * only once that teardown is long over (its close runs on that thread: rlb_port_close). */
static int port_quiet(struct port *p, uint64_t now)
{
    if (!port_link_down(p)) { p->down_ns = 0; return 0; }
    if (!p->down_ns) p->down_ns = now;
    return now - p->down_ns >= PORT_LINGER_NS;
}

static void wait_quiet(struct port *p, uint64_t deadline_ns)  /* ... or until the deadline */
{
    struct timespec ts = {0, 1000000};
    while (!port_quiet(p, rlb_now_ns()) && rlb_now_ns() < deadline_ns) nanosleep(&ts, NULL);
}

static void stop_and_close(uint16_t pid)
{
    rte_eth_dev_stop(pid);
    rte_eth_dev_close(pid);
}

struct closing { uint16_t pid; int done; pthread_mutex_t lock; pthread_cond_t cond; };

static void stop_and_close_then_signal(void *arg)
{
    struct closing *c = arg;
    stop_and_close(c->pid);
    pthread_mutex_lock(&c->lock);
    c->done = 1;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/* The memif PMD runs its half of a connection (accepting, the control messages, the teardown when
 * the other process leaves) on the EAL interrupt thread, and its stop and close run the same
 * teardown (memif_disconnect) and edit the socket's interface list with no lock against that thread.
 * A close on another thread while the interrupt thread handled the peer's disconnect frees the rings
 * twice: the likely end of a node that died (SIGSEGV) closing after its peers left, twice in CI
 * under load, although it had waited for the port to look quiet. An alarm's callback runs on that
 * thread, between its other handlers, so a memif port is stopped and closed there. */
static void stop_and_close_on_interrupt_thread(uint16_t pid)
{
    struct closing c = {.pid = pid, .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    if (rte_thread_is_intr() || rte_eal_alarm_set(1, stop_and_close_then_signal, &c) != 0) {
        stop_and_close(pid);
        return;
    }
    pthread_mutex_lock(&c.lock);
    while (!c.done) pthread_cond_wait(&c.cond, &c.lock);
    pthread_mutex_unlock(&c.lock);
}

int rlb_port_close(int port)
{
    if (port < 0 || port >= MAX_PORTS || !g_ports[port].used) return 0;
    pthread_mutex_lock(&g_lock);
    struct port *p = &g_ports[port];
    if (p->per_peer) stop_and_close_on_interrupt_thread(p->pid);
    else stop_and_close(p->pid);
    p->used = 0;
    p->listener = p->client_link = -1;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* --------------------------------------------------------------------------------- frames */
/* The Ethernet/IPv4/UDP headers and our header of a frame carrying `len` bytes after them. */
static struct rlb_hdr *frame_fill(uint8_t *p, const struct rte_ether_addr *src, int to_listener, uint32_t len)
{
    uint32_t flen = HDR_LEN + len;
    struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
    struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
    struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
    struct rlb_hdr *h = (struct rlb_hdr *)(udp + 1);
    /* The destination MAC is ours, not the peer's: a kernel that sees the frame on a veth
     * classifies it as for another host and drops it early instead of answering with ICMP. */
    rte_ether_addr_copy(&g_dst_mac, &eth->dst_addr);
    rte_ether_addr_copy(src, &eth->src_addr);
    eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
    memset(ip, 0, sizeof(*ip));
    ip->version_ihl = 0x45;
    ip->time_to_live = 64;
    ip->next_proto_id = IPPROTO_UDP;
    ip->total_length = rte_cpu_to_be_16(flen - sizeof(*eth));
    ip->src_addr = rte_cpu_to_be_32(0x0a630000 | (to_listener ? 2 : 1));
    ip->dst_addr = rte_cpu_to_be_32(0x0a630000 | (to_listener ? 1 : 2));
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    udp->src_port = rte_cpu_to_be_16(RLB_UDP_PORT);
    udp->dst_port = rte_cpu_to_be_16(RLB_UDP_PORT);
    udp->dgram_len = rte_cpu_to_be_16(flen - sizeof(*eth) - sizeof(*ip));
    udp->dgram_cksum = 0;
    memset(h, 0, sizeof(*h));
    h->magic = RLB_MAGIC;
    h->version = RLB_VERSION;
    return h;
}

static struct rte_mbuf *frame_new(struct link *lk, uint8_t kind, uint8_t flags, uint32_t len)
{
    struct rte_mbuf *m = rte_pktmbuf_alloc(g_pool);
    if (!m) return NULL;
    uint8_t *p = (uint8_t *)rte_pktmbuf_append(m, HDR_LEN + len);
    if (!p) { rte_pktmbuf_free(m); return NULL; }
    struct rlb_hdr *h = frame_fill(p, &g_ports[lk->port].mac, lk->out_flags & F_TO_LISTENER, len);
    h->kind = kind;
    h->conn = lk->conn;
    h->token = lk->token;
    h->ack = lk->rx_next;
    h->flags = flags | lk->out_flags;
    return m;
}

static inline struct rlb_hdr *frame_hdr(struct rte_mbuf *m)
{
    return (struct rlb_hdr *)(rte_pktmbuf_mtod(m, uint8_t *) + L2L4_LEN);
}

/* Control frames are best effort: they are regenerated when needed, so a full tx ring drops them. */
static void send_control(struct link *lk, uint8_t kind, uint8_t flags)
{
    struct rte_mbuf *m = frame_new(lk, kind, flags, 0);
    if (!m) return;
    if (kind == K_ACK || kind == K_DATA) lk->rx_unacked = 0;
    if (rte_eth_tx_burst(g_ports[lk->port].pid, 0, &m, 1) != 1) { rte_pktmbuf_free(m); return; }
    if (kind == K_ACK) lk->st[S_ACKS]++;
}

static void retransmit(struct link *lk, uint64_t now)
{
    struct rte_mbuf *burst[BURST];
    uint32_t s = lk->tx_acked;
    while (seq_before(s, lk->tx_next)) {
        uint16_t n = 0;
        for (; n < BURST && seq_before(s, lk->tx_next); n++, s++) {
            burst[n] = lk->hist[s % WINDOW];
            rte_pktmbuf_refcnt_update(burst[n], 1);
        }
        uint16_t sent = rte_eth_tx_burst(g_ports[lk->port].pid, 0, burst, n);
        lk->st[S_RETX] += sent;
        if (sent < n) {  /* ring full: the timer goes on from here */
            rte_pktmbuf_free_bulk(burst + sent, n - sent);
            s -= n - sent;
            break;
        }
    }
    if (seq_before(lk->tx_sent, s)) lk->tx_sent = s;  /* a listener's frames the ring refused before went out */
    lk->last_tx_ns = lk->last_retx_ns = now;
}

static void take_ack(struct link *lk, uint32_t ack, int gap, uint64_t now)
{
    if (seq_before(lk->tx_acked, ack) && !seq_before(lk->tx_next, ack)) {
        while (lk->tx_acked != ack) {
            uint32_t i = lk->tx_acked++ % WINDOW;
            rte_pktmbuf_free(lk->hist[i]);
            lk->hist[i] = NULL;
        }
        lk->last_progress_ns = now;
        lk->rto = g_rto;
    }
    if (gap && ack == lk->tx_acked && lk->tx_acked != lk->tx_next && now - lk->last_retx_ns > 20000)
        retransmit(lk, now);  /* the receiver saw a gap: go back to its first missing frame */
}

static void enqueue(struct link *lk, struct msg *m)
{
    m->next = NULL;
    if (lk->q_tail) lk->q_tail->next = m; else lk->q_head = m;
    lk->q_tail = m;
}

/* A listener's link has something waiting (queued messages, or frames the ring did not take): the
 * listener's polls move it on (progress). */
static void set_pending(struct link *lk)
{
    if (lk->pending) return;
    lk->pending = 1;
    g_listeners[lk->listener].backlog++;
}

static void clear_pending(struct link *lk)
{
    if (!lk->pending) return;
    lk->pending = 0;
    if (lk->listener >= 0) g_listeners[lk->listener].backlog--;
}

static void outbox_clear(struct link *lk)
{
    for (struct pend *p = lk->out_head, *next; p; p = next) { next = p->next; free(p); }
    lk->out_head = lk->out_tail = NULL;
    lk->out_bytes = 0;
    clear_pending(lk);
}

/* A link is over. A memif port dies with its one link, and it is never polled again: the PMD
 * tears a memif connection down (unmapping the shared rings) on the EAL interrupt thread when the
 * other process leaves, without any lock against a concurrent rx burst, and that race crashed the
 * replay node about once in ten runs. So whoever says goodbye first waits for the answer before
 * it closes its port, and the answering side stops polling that port before the teardown comes. */
static void link_end(struct link *lk, int why)
{
    struct port *p = &g_ports[lk->port];
    if (!lk->closed) lk->closed = why;
    if (lk->pending) outbox_clear(lk);  /* what waited for the peer goes with it */
    if (p->per_peer && !p->retired) { p->retired_ns = rlb_now_ns(); p->retired = 1; }
}

/* A goodbye tells the peer why when this side drops it (C_OVERSIZE, C_MALFORMED, C_STALLED, C_SLOW). */
static void bye_frame(struct link *lk)
{
    struct rte_mbuf *m = frame_new(lk, K_BYE, 0, 0);
    if (!m) return;
    frame_hdr(m)->pad = lk->closed >= C_OVERSIZE && lk->closed <= C_SLOW ? (uint8_t)lk->closed : 0;
    if (rte_eth_tx_burst(g_ports[lk->port].pid, 0, &m, 1) != 1) rte_pktmbuf_free(m);
    lk->last_bye_ns = rlb_now_ns();
}

static void send_bye(struct link *lk)
{
    if (!lk->bye_sent) { bye_frame(lk); lk->bye_sent = 1; }
}

/* The peer broke the rules: end its link, say why, count it. What it delivered before stays queued. */
static void drop_peer(struct link *lk, int why)
{
    if (lk->closed) return;
    if (why == C_MALFORMED) lk->st[S_MALFORMED]++;
    if (why == C_SLOW) lk->st[S_SLOW]++;
    lk->st[S_DROPPED]++;
    link_end(lk, why);
    send_bye(lk);
}

/* Room in the reassembly buffer for `need` bytes: it grows with what arrived, doubling, never past
 * the message's length. 0, or -1 when memory is short (the frame is not taken; the sender resends). */
static int asm_reserve(struct link *lk, uint32_t need)
{
    if (need <= lk->asm_cap) return 0;
    uint64_t cap = (uint64_t)lk->asm_cap * 2;
    if (cap < need) cap = need;
    if (cap > lk->asm_msg->len) cap = lk->asm_msg->len;
    struct msg *m = realloc(lk->asm_msg, sizeof(struct msg) + cap);
    if (!m) return -1;
    lk->asm_msg = m;
    lk->asm_cap = (uint32_t)cap;
    return 0;
}

static void take_data(struct link *lk, struct rte_mbuf *mb, const struct rlb_hdr *h, uint64_t now)
{
    if (h->fseq != lk->rx_next) {
        if (seq_before(h->fseq, lk->rx_next)) {  /* a retransmission we already have */
            lk->st[S_DUPS]++;
            if (now - lk->last_dup_ack_ns > 20000) { lk->last_dup_ack_ns = now; send_control(lk, K_ACK, 0); }
        } else {  /* a frame is missing: tell the sender where we are, at most every half RTO */
            lk->st[S_OOO]++;
            if (now - lk->last_gap_ns > g_rto / 2) {
                lk->last_gap_ns = now;
                lk->st[S_GAPS]++;
                send_control(lk, K_ACK, F_GAP);
            }
        }
        return;
    }
    if (!lk->asm_msg && h->offset == 0) {  /* a message begins: its length is a claim, checked, not trusted */
        if (h->msg_len > lk->max_message) {
            lk->refused_len = h->msg_len;
            lk->st[S_REFUSED]++;
            drop_peer(lk, C_OVERSIZE);
            return;
        }
        uint32_t first = h->msg_len < ASM_FIRST ? h->msg_len : ASM_FIRST;
        struct msg *m = malloc(sizeof(struct msg) + (first ? first : 1));
        if (!m) return;  /* not taken: the sender resends */
        m->len = h->msg_len;
        lk->asm_msg = m;
        lk->asm_cap = first;
        lk->asm_have = 0;
    }
    struct msg *m = lk->asm_msg;
    /* In order, every fragment continues the message it belongs to; only an empty message has an empty one. */
    if (!m || h->msg_len != m->len || h->offset != lk->asm_have || (uint64_t)h->offset + h->len > m->len ||
        (!h->len && m->len) || rte_pktmbuf_pkt_len(mb) < HDR_LEN + (uint32_t)h->len) {
        drop_peer(lk, C_MALFORMED);
        return;
    }
    if (asm_reserve(lk, h->offset + h->len) < 0) return;
    m = lk->asm_msg;
    if (h->len) {
        const void *d = rte_pktmbuf_read(mb, HDR_LEN, h->len, m->data + h->offset);
        if (d != m->data + h->offset) memcpy(m->data + h->offset, d, h->len);
    }
    lk->asm_have += h->len;
    lk->rx_next++;
    lk->rx_unacked++;
    lk->last_rx_ns = now;
    if (lk->asm_have == m->len) {
        lk->asm_msg = NULL;
        lk->asm_cap = 0;
        enqueue(lk, m);
    }
    if (lk->rx_unacked >= WINDOW / 4 || (h->flags & F_ACK_REQ)) send_control(lk, K_ACK, 0);
}

static int link_alloc(void)
{
    for (int i = 0; i < MAX_LINKS; i++) {
        if (!g_links[i].used) {
            struct link *lk = &g_links[i];
            memset(lk, 0, sizeof(*lk));
            lk->used = 1;
            /* Peer ids are not reused for a long while (2^23 uses of a slot): an application that
             * dropped or lost a peer must not take a newcomer in its slot for it. */
            g_link_uses[i] = (g_link_uses[i] + 1) & ((1u << 31) / MAX_LINKS - 1);
            lk->peer_id = (int)(g_link_uses[i] * MAX_LINKS + i);
            lk->listener = -1;
            lk->rto = g_rto;
            lk->last_progress_ns = lk->last_heard_ns = rlb_now_ns();
            return i;
        }
    }
    return fail(EMFILE, "too many DPDK links open (%d)", MAX_LINKS);
}

static void hello(int port, const struct rlb_hdr *h, const struct rte_ether_hdr *eth)
{
    struct listener *L = &g_listeners[g_ports[port].listener];
    int id = -1;
    if (L->nlinks < MAX_LINKS) {
        pthread_mutex_lock(&g_lock);
        id = link_alloc();
        pthread_mutex_unlock(&g_lock);
    }
    if (id < 0) { L->counted[S_REFUSED_PEERS]++; return; }
    struct link *lk = &g_links[id];
    lk->port = port;
    lk->listener = (int)(L - g_listeners);
    lk->conn = h->conn;
    lk->token = L->token;
    lk->max_message = L->max_message;
    lk->give_up_ns = L->give_up_ns;
    lk->connected = 1;
    rte_ether_addr_copy(&eth->src_addr, &lk->peer_mac);
    L->links[L->nlinks++] = id;
    send_control(lk, K_WELCOME, 0);
}

/* The link a frame to a listener belongs to: by connection id, and on a memif port (one peer, one
 * link) whatever link the port carries, so that a peer cannot open a second conversation there. */
static struct link *listener_link(struct listener *L, int port, uint32_t conn)
{
    struct link *same_port = NULL;
    for (int i = 0; i < L->nlinks; i++) {
        struct link *c = &g_links[L->links[i]];
        if (c->port != port) continue;
        if (c->conn == conn) return c;
        same_port = c;
    }
    return g_ports[port].per_peer ? same_port : NULL;
}

/* A frame that breaks the protocol. Its sender is dropped where we know it: `lk` when the header
 * named a connection, else the one peer a memif port carries. Otherwise (garbage on a wire) it is
 * only counted. */
static void malformed(int port, struct link *lk)
{
    struct port *p = &g_ports[port];
    if (!lk && p->per_peer && p->listener >= 0) {
        struct listener *L = &g_listeners[p->listener];
        for (int i = 0; i < L->nlinks && !lk; i++) if (g_links[L->links[i]].port == port) lk = &g_links[L->links[i]];
    } else if (!lk && p->per_peer && p->client_link >= 0) {
        lk = &g_links[p->client_link];
    }
    if (lk) drop_peer(lk, C_MALFORMED);
    else if (p->listener >= 0) g_listeners[p->listener].counted[S_MALFORMED]++;
    else if (p->client_link >= 0) g_links[p->client_link].st[S_MALFORMED]++;
}

static void on_frame(int port, struct rte_mbuf *mb, uint64_t now)
{
    struct rlb_hdr tmp;
    uint8_t l2l4[L2L4_LEN];
    struct port *p = &g_ports[port];
    uint32_t len = rte_pktmbuf_pkt_len(mb);
    if (len < L2L4_LEN) return;  /* not even UDP: not ours to judge (a wire carries others' traffic) */
    const struct rte_ether_hdr *eth = rte_pktmbuf_read(mb, 0, L2L4_LEN, l2l4);
    const struct rte_ipv4_hdr *ip = (const struct rte_ipv4_hdr *)(eth + 1);
    const struct rte_udp_hdr *udp = (const struct rte_udp_hdr *)(ip + 1);
    if (eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) || ip->next_proto_id != IPPROTO_UDP ||
        udp->dst_port != rte_cpu_to_be_16(RLB_UDP_PORT)) return;  /* someone else's traffic */
    if (len < HDR_LEN || ip->version_ihl != 0x45) { malformed(port, NULL); return; }
    const struct rlb_hdr *h = rte_pktmbuf_read(mb, L2L4_LEN, sizeof(tmp), &tmp);
    if (h->magic != RLB_MAGIC || h->version != RLB_VERSION || h->kind < K_DATA || h->kind > K_LAST ||
        (h->flags & ~F_ALL)) { malformed(port, NULL); return; }
    struct link *lk = NULL;
    if (h->flags & F_TO_LISTENER) {
        if (p->listener < 0) return;  /* another client's frame on a shared wire */
        struct listener *L = &g_listeners[p->listener];
        lk = listener_link(L, port, h->conn);
        if (lk && lk->conn != h->conn) { malformed(port, lk); return; }  /* a second conversation on a memif port */
        if (!lk) {
            if (h->token != L->token) return;  /* another listener on the same wire */
            if (h->kind == K_HELLO || (h->kind == K_DATA && h->fseq < WINDOW)) hello(port, h, eth);  /* data: the hello was lost */
            if (h->kind == K_HELLO) return;
            lk = listener_link(L, port, h->conn);
        } else if (h->kind == K_HELLO) {
            return;  /* a repeated hello */
        }
        if (lk && h->kind == K_WELCOME) { malformed(port, lk); return; }
    } else if (p->client_link >= 0 && g_links[p->client_link].conn == h->conn) {
        lk = &g_links[p->client_link];
        if (h->kind == K_HELLO) { malformed(port, lk); return; }
    } else {
        if (p->per_peer) malformed(port, NULL);  /* a memif port carries frames of its one link only */
        return;
    }
    if (!lk) return;
    lk->st[S_FRECV]++;
    lk->last_heard_ns = now;
    if (lk->closed) {  /* a peer we dropped talks on (on a wire, our goodbye may be lost): say it again */
        if (h->kind != K_BYE && since(now, lk->last_bye_ns) > lk->rto) bye_frame(lk);
        return;
    }
    switch (h->kind) {
    case K_WELCOME:
        if (!lk->connected) { lk->connected = 1; rte_ether_addr_copy(&eth->src_addr, &lk->peer_mac); }
        return;
    case K_BYE:
        send_bye(lk);  /* the goodbye's answer, unless it is the answer to ours */
        link_end(lk, h->pad >= C_OVERSIZE && h->pad <= C_SLOW ? C_PEER_DROPPED + h->pad : C_BYE);
        return;
    case K_ACK:
        take_ack(lk, h->ack, h->flags & F_GAP, now);
        if (h->flags & F_ACK_REQ) send_control(lk, K_ACK, 0);
        return;
    case K_DATA:
        take_ack(lk, h->ack, 0, now);
        take_data(lk, mb, h, now);
        return;
    }
}

static int poll_port(int port, uint64_t now)
{
    struct rte_mbuf *rx[BURST];
    if (g_ports[port].retired) return 0;
    uint16_t n = rte_eth_rx_burst(g_ports[port].pid, 0, rx, BURST);
    for (uint16_t i = 0; i < n; i++) {
        on_frame(port, rx[i], now);
        rte_pktmbuf_free(rx[i]);
    }
    return n;
}

/* Timers of one link: delayed acknowledgement, retransmission, giving up, a peer silent mid-message,
 * the port going down. */
static void service(struct link *lk, uint64_t now, int check_link)
{
    if (lk->closed) return;
    if (lk->rx_unacked && now - lk->last_rx_ns > DELAYED_ACK_NS) send_control(lk, K_ACK, 0);
    /* An honest sender resends until its message is through; one that went quiet halfway holds
     * memory for nothing. */
    if (lk->asm_msg && since(now, lk->last_heard_ns) > lk->give_up_ns) {
        drop_peer(lk, C_STALLED);
        return;
    }
    if (lk->tx_acked != lk->tx_next && since(now, lk->last_tx_ns) > lk->rto) {
        if (since(now, lk->last_progress_ns) > lk->give_up_ns) {
            link_end(lk, C_SILENT);  /* the peer stopped acknowledging: it is gone */
        } else {
            retransmit(lk, now);
            lk->rto = lk->rto * 2 < 200000000ull ? lk->rto * 2 : 200000000ull;
        }
    }
    if (check_link && lk->connected && port_link_down(&g_ports[lk->port])) link_end(lk, C_DOWN);
}

static void progress(struct listener *L);

/* Every port's frames; then what waits for acknowledgements that came goes out. */
static int poll_listener(struct listener *L, uint64_t now)
{
    int n = 0, nports = __atomic_load_n(&L->nports, __ATOMIC_ACQUIRE);
    for (int i = 0; i < nports; i++) n += poll_port(L->ports[i], now);
    if (L->backlog) progress(L);
    return n;
}

static void service_listener(struct listener *L, uint64_t now)
{
    int check = now - L->last_check_ns > LINK_CHECK_NS;
    if (check) L->last_check_ns = now;
    for (int i = 0; i < L->nlinks; i++) service(&g_links[L->links[i]], now, check);
}

/* Poll whatever can carry frames for this link (a listener's links share its ports). */
static void pump(struct link *lk, uint32_t *idle, uint64_t *last_check)
{
    uint64_t now = rlb_now_ns();
    int got;
    if (lk->listener >= 0) {
        struct listener *L = &g_listeners[lk->listener];
        got = poll_listener(L, now);
        service_listener(L, now);
    } else {
        got = poll_port(lk->port, now);
        int check = now - *last_check > LINK_CHECK_NS;
        if (check) *last_check = now;
        service(lk, now, check);
    }
    if (got) *idle = 0; else idle_step(idle);
}

/* Say goodbye and wait (briefly) for the answer; the link is over either way. */
static void say_bye(struct link *lk, uint64_t wait_ns)
{
    if (!lk->closed) {
        send_bye(lk);
        uint64_t start = rlb_now_ns(), last_check = 0;
        uint32_t idle = 0;
        while (!lk->closed && rlb_now_ns() - start < wait_ns) pump(lk, &idle, &last_check);
    }
    link_end(lk, C_BYE);
}

/* --------------------------------------------------------------------------------- sending */
static void copy_parts(uint8_t *dst, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t off, uint32_t len)
{
    for (int i = 0; i < nparts && len; i++) {
        if (off >= lens[i]) { off -= lens[i]; continue; }
        uint32_t take = lens[i] - (uint32_t)off < len ? lens[i] - (uint32_t)off : len;
        memcpy(dst, parts[i] + off, take);
        dst += take;
        len -= take;
        off = 0;
    }
}

static int link_gone(struct link *lk)
{
    switch (lk->closed) {
    case 0: return 0;
    case C_SILENT: return fail(ENOTCONN, "the peer stopped acknowledging (gone?)");
    case C_DOWN: return fail(ENOTCONN, "the port's link went down (peer gone)");
    case C_OVERSIZE:
        return fail(ENOTCONN, "the peer sent a message of %u bytes, over this side's max_message_bytes=%u; "
                    "the connection was dropped", lk->refused_len, lk->max_message);
    case C_MALFORMED: return fail(ENOTCONN, "the peer's frames broke the protocol; the connection was dropped");
    case C_STALLED: return fail(ENOTCONN, "the peer went quiet in the middle of a message; the connection was dropped");
    case C_SLOW:
        return fail(ENOTCONN, "the peer was dropped as a slow consumer: it did not acknowledge what was sent to it");
    case C_CLOSED: return fail(ENOTCONN, "this side dropped the peer");
    case C_PEER_DROPPED + C_OVERSIZE:
        return fail(ENOTCONN, "the other side refused a message over its max_message_bytes and dropped the connection");
    case C_PEER_DROPPED + C_MALFORMED:
        return fail(ENOTCONN, "the other side found this side's frames malformed and dropped the connection");
    case C_PEER_DROPPED + C_STALLED:
        return fail(ENOTCONN, "the other side dropped the connection: a message stopped coming halfway");
    case C_PEER_DROPPED + C_SLOW:
        return fail(ENOTCONN, "the other side dropped the connection: this side did not read what it was sent "
                    "(a slow consumer)");
    default: return fail(ENOTCONN, "the other side closed the connection");
    }
}

static int flush(struct link *lk, struct rte_mbuf **burst, uint16_t n)
{
    uint16_t sent = 0;
    uint32_t idle = 0;
    uint64_t last_check = 0, t0 = 0;
    while (1) {
        sent += rte_eth_tx_burst(g_ports[lk->port].pid, 0, burst + sent, n - sent);
        if (sent == n) break;
        /* The ring is full: keep receiving (the peer may be waiting on us), back off, retry. */
        if (!t0) { t0 = rlb_now_ns(); lk->st[S_TXFULL]++; }
        pump(lk, &idle, &last_check);
        if (lk->closed || rlb_now_ns() - t0 > lk->give_up_ns) {
            rte_pktmbuf_free_bulk(burst + sent, n - sent);  /* history still holds them */
            return lk->closed ? link_gone(lk) : fail(ETIMEDOUT, "transmit ring stayed full");
        }
    }
    lk->st[S_FSENT] += n;
    lk->last_tx_ns = rlb_now_ns();
    return 0;
}

/* A listener's burst of the window's newest n frames: it never waits. What the ring does not take
 * stays in the window from tx_sent on, for progress() to send (it would arrive out of order if
 * later frames went first, so once behind, later bursts wait their turn too). */
static void flush_nowait(struct link *lk, struct rte_mbuf **burst, uint16_t n)
{
    uint16_t sent = 0;
    if (lk->tx_sent == lk->tx_next - n) {
        sent = rte_eth_tx_burst(g_ports[lk->port].pid, 0, burst, n);
        lk->tx_sent += sent;
        lk->st[S_FSENT] += sent;
        lk->last_tx_ns = rlb_now_ns();
    }
    if (sent < n) {
        rte_pktmbuf_free_bulk(burst + sent, n - sent);  /* the history holds them */
        lk->st[S_TXFULL]++;
    }
}

/* Frames of a message of `total` bytes from byte *offp on (`parts` hold its bytes from byte `base`
 * on), while the window and the mbuf pool have room. A client's link (`wait`) waits for room; a
 * listener's never waits. 1: the whole message is framed; 0: not yet (*offp says how far); < 0: an
 * error (only while waiting). */
static int frame_msg(struct link *lk, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t total,
                     uint64_t base, uint64_t *offp, int wait)
{
    uint32_t payload = g_ports[lk->port].payload;
    uint64_t off = *offp;
    struct rte_mbuf *burst[BURST];
    uint16_t nb = 0;
    uint32_t idle = 0;
    uint64_t last_check = 0;
    int ret, done = 0;
    for (;;) {
        while (lk->tx_next - lk->tx_acked >= WINDOW) {  /* window full: wait for acknowledgements */
            if (!wait) goto out;
            if (nb) { if ((ret = flush(lk, burst, nb)) < 0) return ret; nb = 0; }
            pump(lk, &idle, &last_check);
            if ((ret = link_gone(lk))) return ret;
        }
        uint32_t len = total - off < payload ? (uint32_t)(total - off) : payload;
        struct rte_mbuf *m = frame_new(lk, K_DATA, 0, len);
        if (!m) {
            if (!wait) goto out;
            if (nb) { if ((ret = flush(lk, burst, nb)) < 0) return ret; nb = 0; }
            pump(lk, &idle, &last_check);  /* the pool is empty: acknowledgements free history */
            if ((ret = link_gone(lk))) return ret;
            continue;
        }
        struct rlb_hdr *h = frame_hdr(m);
        h->fseq = lk->tx_next;
        h->msg_len = (uint32_t)total;
        h->offset = (uint32_t)off;
        h->len = (uint16_t)len;
        copy_parts((uint8_t *)(h + 1), parts, lens, nparts, off - base, len);
        lk->rx_unacked = 0;  /* this frame carries our acknowledgement */
        rte_pktmbuf_refcnt_update(m, 1);  /* one reference for the history, one for the transmit */
        lk->hist[lk->tx_next % WINDOW] = m;
        lk->tx_next++;
        burst[nb++] = m;
        off += len;
        if (nb == BURST) {
            if (!wait) flush_nowait(lk, burst, nb);
            else if ((ret = flush(lk, burst, nb)) < 0) return ret;
            nb = 0;
        }
        if (off >= total) { done = 1; break; }
    }
out:
    if (nb) {
        if (!wait) flush_nowait(lk, burst, nb);
        else if ((ret = flush(lk, burst, nb)) < 0) return ret;
    }
    *offp = off;
    return done;
}

static int send_msg(struct link *lk, const uint8_t *const *parts, const uint32_t *lens, int nparts)
{
    uint64_t total = 0, off = 0;
    for (int i = 0; i < nparts; i++) total += lens[i];
    if (total > 0xFFFFFFFFull) return fail(EMSGSIZE, "message of %llu bytes is too large", (unsigned long long)total);
    int ret = link_gone(lk);
    if (ret) return ret;
    if ((ret = frame_msg(lk, parts, lens, nparts, total, 0, &off, 1)) < 0) return ret;
    lk->st[S_MSENT]++;
    lk->st[S_BSENT] += total;
    return 0;
}

/* A listener's link: bytes [start, total) of a message go to the back of its queue (a copy). */
static int queue_msg(struct link *lk, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t total,
                     uint64_t start)
{
    struct pend *p = malloc(sizeof(struct pend) + (total - start ? total - start : 1));
    if (!p) {  /* a message may be half out: the peer cannot be served on */
        link_end(lk, C_CLOSED);
        send_bye(lk);
        return fail(ENOMEM, "no memory to queue a message of %llu bytes; the peer was dropped",
                    (unsigned long long)total);
    }
    p->next = NULL;
    p->len = (uint32_t)total;
    p->start = p->off = (uint32_t)start;
    copy_parts(p->data, parts, lens, nparts, start, (uint32_t)(total - start));
    if (lk->out_tail) lk->out_tail->next = p; else lk->out_head = p;
    lk->out_tail = p;
    lk->out_bytes += total - start;
    set_pending(lk);
    return 0;
}

/* Move a listener's link on as far as its window, the mbuf pool and the transmit ring allow now:
 * first the frames the ring did not take, then the queued messages, in order. Never waits. */
static void advance(struct link *lk)
{
    if (lk->closed) { outbox_clear(lk); return; }
    if (seq_before(lk->tx_sent, lk->tx_acked)) lk->tx_sent = lk->tx_acked;  /* (a lying ack) */
    while (lk->tx_sent != lk->tx_next) {
        struct rte_mbuf *burst[BURST];
        uint16_t n = 0;
        for (uint32_t s = lk->tx_sent; n < BURST && s != lk->tx_next; n++, s++) {
            burst[n] = lk->hist[s % WINDOW];
            rte_pktmbuf_refcnt_update(burst[n], 1);
        }
        uint16_t sent = rte_eth_tx_burst(g_ports[lk->port].pid, 0, burst, n);
        lk->tx_sent += sent;
        lk->st[S_FSENT] += sent;
        if (sent) lk->last_tx_ns = rlb_now_ns();
        if (sent < n) { rte_pktmbuf_free_bulk(burst + sent, n - sent); return; }
    }
    while (lk->out_head) {
        struct pend *p = lk->out_head;
        const uint8_t *data = p->data;
        uint32_t have = p->len - p->start;
        uint64_t off = p->off;
        int done = frame_msg(lk, &data, &have, 1, p->len, p->start, &off, 0);
        lk->out_bytes -= off - p->off;
        p->off = (uint32_t)off;
        if (done <= 0) return;  /* the window (or the pool) is full: on at a later poll */
        lk->out_head = p->next;
        if (!lk->out_head) lk->out_tail = NULL;
        free(p);
    }
    if (lk->tx_sent == lk->tx_next) clear_pending(lk);
}

static void progress(struct listener *L)
{
    for (int i = 0; i < L->nlinks; i++) {
        struct link *lk = &g_links[L->links[i]];
        if (lk->pending) advance(lk);
    }
}

/* ------------------------------------------------------------------------------ receiving */
static struct link *link_at(int id)
{
    if (id < 0 || id >= MAX_LINKS || !g_links[id].used) { fail(EBADF, "no link %d", id); return NULL; }
    return &g_links[id];
}

static int64_t pop(struct link *lk, struct msg **held, uint8_t **data)
{
    struct msg *m = lk->q_head;
    lk->q_head = m->next;
    if (!lk->q_head) lk->q_tail = NULL;
    /* What the application took is acknowledged now: an application that then works for a while
     * without calling in would otherwise leave its peer's frames unacknowledged until the peer gave
     * it up for gone (the delayed ACK needs someone polling). */
    if (lk->rx_unacked && !lk->closed) send_control(lk, K_ACK, 0);
    *held = m;
    *data = m->data;
    lk->st[S_MRECV]++;
    lk->st[S_BRECV] += m->len;
    return m->len;
}

int64_t rlb_recv(int id, uint64_t timeout_ns, uint8_t **data)
{
    struct link *lk = link_at(id);
    if (!lk) return -EBADF;
    free(lk->held);
    lk->held = NULL;
    uint64_t start = rlb_now_ns(), last_check = 0;
    uint32_t idle = 0;
    while (1) {
        if (lk->q_head) return pop(lk, &lk->held, data);
        int ret = link_gone(lk);
        if (ret) return ret;
        pump(lk, &idle, &last_check);
        if (!lk->q_head && rlb_now_ns() - start >= timeout_ns) return -ETIMEDOUT;
    }
}

int rlb_send(int id, const uint8_t *const *parts, const uint32_t *lens, int nparts)
{
    struct link *lk = link_at(id);
    return lk ? send_msg(lk, parts, lens, nparts) : -EBADF;
}

int64_t rlb_request(int id, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t timeout_ns,
                    uint8_t **data)
{
    int ret = rlb_send(id, parts, lens, nparts);
    return ret < 0 ? ret : rlb_recv(id, timeout_ns, data);
}

void rlb_link_stats(int id, uint64_t *out)
{
    struct link *lk = link_at(id);
    if (lk) memcpy(out, lk->st, sizeof(lk->st));
}

static void link_free(struct link *lk)
{
    for (uint32_t s = lk->tx_acked; s != lk->tx_next; s++) rte_pktmbuf_free(lk->hist[s % WINDOW]);
    for (struct msg *m = lk->q_head, *next; m; m = next) { next = m->next; free(m); }
    outbox_clear(lk);
    free(lk->held);
    free(lk->asm_msg);
    lk->used = 0;
}

/* --------------------------------------------------------------------------------- clients */
/* Does not wait for the listener's answer: a thread that connects and then serves the listener
 * would wait forever. The listener learns the link from the hello, or from the first data frame. */
int rlb_connect(int port, uint32_t token, uint64_t timeout_ns, uint32_t max_message, uint64_t give_up_ns)
{
    if (port < 0 || port >= MAX_PORTS || !g_ports[port].used) return fail(EBADF, "no port %d", port);
    uint64_t start = rlb_now_ns();
    uint32_t idle = 0;
    while (1) {  /* memif: the server's side accepts the interface without its owner's help */
        struct rte_eth_link link;
        memset(&link, 0, sizeof(link));
        rte_eth_link_get_nowait(g_ports[port].pid, &link);
        if (link.link_status) break;
        if (rlb_now_ns() - start > timeout_ns)
            return fail(ETIMEDOUT, "the port's link did not come up within %.1f s", timeout_ns / 1e9);
        idle_step(&idle);
    }
    uint32_t conn = 0;
    while (!conn) if (getrandom(&conn, sizeof(conn), 0) != sizeof(conn)) conn = (uint32_t)rlb_now_ns();
    pthread_mutex_lock(&g_lock);
    int id = link_alloc();
    pthread_mutex_unlock(&g_lock);
    if (id < 0) return id;
    struct link *lk = &g_links[id];
    lk->port = port;
    lk->conn = conn;
    lk->token = token;
    lk->max_message = max_message;
    lk->give_up_ns = give_up_ns;
    lk->out_flags = F_TO_LISTENER;
    lk->connected = 1;
    g_ports[port].client_link = id;
    send_control(lk, K_HELLO, 0);
    /* A memif client gives the listener its first free receive slots in its first rx burst: until
     * then the listener could send nothing, and a peer that only sends would never hear back. */
    poll_port(port, rlb_now_ns());
    return id;
}

void rlb_link_close(int id)
{
    struct link *lk = link_at(id);
    if (!lk) return;
    if (!lk->closed) {
        /* Let the last frames be acknowledged (briefly), then say goodbye. */
        uint64_t start = rlb_now_ns(), last_check = 0;
        uint32_t idle = 0;
        while (lk->tx_acked != lk->tx_next && !lk->closed && rlb_now_ns() - start < 200000000ull)
            pump(lk, &idle, &last_check);
    }
    say_bye(lk, BYE_WAIT_NS);
    if (lk->listener < 0 && g_ports[lk->port].client_link == id) g_ports[lk->port].client_link = -1;
    link_free(lk);
}

/* ------------------------------------------------------------------------------- listeners */
static struct listener *listener_at(int id)
{
    if (id < 0 || id >= MAX_LISTENERS || !g_listeners[id].used) { fail(EBADF, "no listener %d", id); return NULL; }
    return &g_listeners[id];
}

int rlb_listener_new(uint32_t token, uint32_t max_message, uint64_t give_up_ns, uint64_t max_queued)
{
    pthread_mutex_lock(&g_lock);
    int id = -1;
    for (int i = 0; i < MAX_LISTENERS; i++) if (!g_listeners[i].used) { id = i; break; }
    if (id >= 0) {
        memset(&g_listeners[id], 0, sizeof(g_listeners[id]));
        g_listeners[id].used = 1;
        g_listeners[id].token = token;
        g_listeners[id].max_message = max_message;
        g_listeners[id].give_up_ns = give_up_ns;
        g_listeners[id].max_queued = max_queued;
    }
    pthread_mutex_unlock(&g_lock);
    return id >= 0 ? id : fail(EMFILE, "too many listeners");
}

int rlb_listener_add_port(int id, int port)
{
    struct listener *L = listener_at(id);
    if (!L) return -EBADF;
    if (port < 0 || port >= MAX_PORTS || !g_ports[port].used) return fail(EBADF, "no port %d", port);
    pthread_mutex_lock(&g_lock);  /* against reap_ports, which removes ports */
    int n = __atomic_load_n(&L->nports, __ATOMIC_ACQUIRE);
    if (n >= MAX_PORTS) { pthread_mutex_unlock(&g_lock); return fail(EMFILE, "too many ports on one listener"); }
    g_ports[port].listener = id;
    L->ports[n] = port;
    __atomic_store_n(&L->nports, n + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* Close the ports of departed memif peers (DPDK has 32 port ids in all) once their teardown is
 * over, or once they have said goodbye long ago and still hold the link up; and retire the port of a
 * peer that asked for an interface but never said hello. */
static void reap_ports(struct listener *L, uint64_t now)
{
    for (int i = 0; i < __atomic_load_n(&L->nports, __ATOMIC_ACQUIRE);) {
        int port = L->ports[i];
        struct port *p = &g_ports[port];
        int linked = 0;
        for (int k = 0; k < L->nlinks && !linked; k++) linked = g_links[L->links[k]].port == port;
        if (p->per_peer && !linked && !p->retired && since(now, p->opened_ns) > L->give_up_ns) {
            p->retired = 1;
            p->retired_ns = now;
            L->counted[S_DROPPED]++;
        }
        int ripe = !linked && p->retired && (port_quiet(p, now) || since(now, p->retired_ns) > PORT_LINGER_MAX_NS);
        if (!ripe) { i++; continue; }
        pthread_mutex_lock(&g_lock);
        int n = __atomic_load_n(&L->nports, __ATOMIC_ACQUIRE);
        L->ports[i] = L->ports[n - 1];
        __atomic_store_n(&L->nports, n - 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_lock);
        rlb_port_close(port);
    }
}

/* Forget peers that are gone and whose messages were all delivered. */
static void reap(struct listener *L)
{
    for (int i = 0; i < L->nlinks;) {
        struct link *lk = &g_links[L->links[i]];
        if (lk->closed && !lk->q_head) {
            for (int k = 0; k < RLB_STATS_N; k++) L->counted[k] += lk->st[k];
            link_free(lk);
            L->links[i] = L->links[--L->nlinks];
        } else {
            i++;
        }
    }
}

int64_t rlb_listener_recv(int id, uint64_t timeout_ns, int *peer, uint8_t **data)
{
    struct listener *L = listener_at(id);
    if (!L) return -EBADF;
    free(L->held);
    L->held = NULL;
    uint64_t start = rlb_now_ns();
    uint32_t idle = 0;
    while (1) {
        for (int k = 0; k < L->nlinks; k++) {  /* round-robin: a busy peer cannot starve the others */
            int i = (L->turn + k) % L->nlinks;
            struct link *lk = &g_links[L->links[i]];
            if (lk->q_head) {
                L->turn = (i + 1) % L->nlinks;
                *peer = lk->peer_id;
                return pop(lk, &L->held, data);
            }
        }
        uint64_t now = rlb_now_ns();
        int got = poll_listener(L, now);
        if (!got) {
            service_listener(L, now);
            reap(L);
            reap_ports(L, now);
        }
        int ready = 0;
        for (int k = 0; k < L->nlinks && !ready; k++) ready = g_links[L->links[k]].q_head != NULL;
        if (ready) continue;
        if (now - start >= timeout_ns) return -ETIMEDOUT;
        if (got) idle = 0; else idle_step(&idle);
    }
}

/* The link of a listener's peer, by its id (a link is in its listener's links from hello to link_free). */
static struct link *listener_peer(struct listener *L, int peer)
{
    struct link *lk = &g_links[(unsigned)peer % MAX_LINKS];
    return lk->used && lk->peer_id == peer && lk->listener == (int)(L - g_listeners) ? lk : NULL;
}

/* rlb_listener_send's other cases, never waiting: something waits for the link (done < 0: nothing of
 * this message was framed), or its window or transmit ring filled (bytes [0, off) are framed). A
 * listener that only sends polls nothing else, so the acknowledgements that came meanwhile wait in
 * the rx rings: take them, a bounded number of bursts (each poll moves every queue on). What is still
 * left waits in the link's queue. */
static __attribute__((noinline)) int send_rest(struct listener *L, struct link *lk, int peer,
                                               const uint8_t *const *parts, const uint32_t *lens, int nparts,
                                               uint64_t total, uint64_t off, int done)
{
    int ret;
    if (done < 0) {
        for (int k = 0; k < ACK_POLLS && lk->pending; k++)
            if (!poll_listener(L, rlb_now_ns())) break;
        if ((ret = link_gone(lk))) return ret;
        if (lk->pending) {  /* behind what waits, within the bound (a message into an empty queue always) */
            if (lk->out_head && lk->out_bytes + total > L->max_queued) {
                unsigned long long waiting = (unsigned long long)lk->out_bytes;
                drop_peer(lk, C_SLOW);
                return fail(ENOBUFS, "peer %d was dropped as a slow consumer: it did not acknowledge what was sent "
                            "to it (%llu bytes waiting, max_queued_bytes=%llu)", peer, waiting,
                            (unsigned long long)L->max_queued);
            }
            if ((ret = queue_msg(lk, parts, lens, nparts, total, 0)) < 0) return ret;
            goto sent;
        }
        done = frame_msg(lk, parts, lens, nparts, total, 0, &off, 0);
    }
    for (int k = 0; !done && k < ACK_POLLS && lk->tx_sent == lk->tx_next; k++) {
        if (!poll_listener(L, rlb_now_ns()) || lk->closed) break;
        done = frame_msg(lk, parts, lens, nparts, total, 0, &off, 0);
    }
    if ((ret = link_gone(lk))) return ret;
    if (!done && (ret = queue_msg(lk, parts, lens, nparts, total, off)) < 0) return ret;
    if (lk->tx_sent != lk->tx_next) set_pending(lk);  /* the transmit ring was full */
sent:
    lk->st[S_MSENT]++;
    lk->st[S_BSENT] += total;
    return 0;
}

/* Never waits on the peer. The common case (nothing waiting, room in the window and the ring) frames
 * the message straight from the caller's parts, as a client's send does; the rest is send_rest's. */
int rlb_listener_send(int id, int peer, const uint8_t *const *parts, const uint32_t *lens, int nparts)
{
    struct listener *L = listener_at(id);
    if (!L) return -EBADF;
    struct link *lk = listener_peer(L, peer);
    if (!lk) return fail(ENOTCONN, "peer %d is not connected", peer);
    uint64_t total = 0, off = 0;
    for (int i = 0; i < nparts; i++) total += lens[i];
    if (total > 0xFFFFFFFFull) return fail(EMSGSIZE, "message of %llu bytes is too large", (unsigned long long)total);
    if (lk->closed) return link_gone(lk);
    if (lk->pending) return send_rest(L, lk, peer, parts, lens, nparts, total, 0, -1);
    int done = frame_msg(lk, parts, lens, nparts, total, 0, &off, 0);
    if (!done || lk->tx_sent != lk->tx_next) return send_rest(L, lk, peer, parts, lens, nparts, total, off, done);
    lk->st[S_MSENT]++;
    lk->st[S_BSENT] += total;
    return 0;
}

int rlb_listener_peers(int id, int *out, int cap)
{
    struct listener *L = listener_at(id);
    if (!L) return -EBADF;
    int n = 0;
    for (int i = 0; i < L->nlinks; i++) {
        if (g_links[L->links[i]].closed) continue;
        if (n < cap) out[n] = g_links[L->links[i]].peer_id;
        n++;
    }
    return n;
}

int rlb_listener_drop(int id, int peer, int why)
{
    struct listener *L = listener_at(id);
    if (!L) return -EBADF;
    if (why && (why < C_OVERSIZE || why > C_SLOW)) return fail(EINVAL, "no such reason to drop a peer: %d", why);
    struct link *lk = listener_peer(L, peer);
    if (!lk || lk->closed) return 0;
    if (why == C_OVERSIZE) lk->st[S_REFUSED]++;
    if (why) {
        drop_peer(lk, why);
    } else {
        link_end(lk, C_CLOSED);
        send_bye(lk);
    }
    return 0;
}

void rlb_listener_stats(int id, uint64_t *out)
{
    struct listener *L = listener_at(id);
    if (!L) return;
    memcpy(out, L->counted, sizeof(L->counted));
    for (int i = 0; i < L->nlinks; i++)
        for (int k = 0; k < RLB_STATS_N; k++) out[k] += g_links[L->links[i]].st[k];
}

void rlb_listener_close(int id)
{
    struct listener *L = listener_at(id);
    if (!L) return;
    /* What waits in peers' queues goes out first, for as long as a goodbye's answer may take. */
    uint64_t start = rlb_now_ns();
    uint32_t idle = 0;
    while (L->backlog && rlb_now_ns() - start < BYE_WAIT_NS) {
        uint64_t now = rlb_now_ns();
        int got = poll_listener(L, now);
        service_listener(L, now);
        if (got) idle = 0; else idle_step(&idle);
    }
    /* Goodbye to every peer (what still waits stays unsent), then wait (briefly) for their answers
     * before the ports stop. */
    for (int i = 0; i < L->nlinks; i++) {
        struct link *lk = &g_links[L->links[i]];
        outbox_clear(lk);
        if (!lk->closed) send_bye(lk);
    }
    start = rlb_now_ns();
    idle = 0;
    while (rlb_now_ns() - start < BYE_WAIT_NS) {
        int open = 0;
        for (int i = 0; i < L->nlinks; i++) open += !g_links[L->links[i]].closed;
        if (!open) break;
        if (poll_listener(L, rlb_now_ns())) idle = 0; else idle_step(&idle);
    }
    for (int i = 0; i < L->nlinks; i++) {
        link_end(&g_links[L->links[i]], 1);
        link_free(&g_links[L->links[i]]);
    }
    L->nlinks = 0;
    free(L->held);
    L->held = NULL;
    /* Peers that answered close their ends now: give them the same wait before closing ours. */
    int nports = __atomic_load_n(&L->nports, __ATOMIC_ACQUIRE);
    uint64_t deadline = rlb_now_ns() + BYE_WAIT_NS;
    for (int i = 0; i < nports; i++)
        if (g_ports[L->ports[i]].per_peer) wait_quiet(&g_ports[L->ports[i]], deadline);
    for (int i = 0; i < nports; i++) rlb_port_close(L->ports[i]);
    pthread_mutex_lock(&g_lock);
    L->used = 0;
    pthread_mutex_unlock(&g_lock);
}

/* ------------------------------------------------------------------------ raw frames (tests) */
static struct port *raw_port(int port)
{
    if (port < 0 || port >= MAX_PORTS || !g_ports[port].used) { fail(EBADF, "no port %d", port); return NULL; }
    if (g_ports[port].listener >= 0 || g_ports[port].client_link >= 0) { fail(EBUSY, "port %d carries links", port); return NULL; }
    return &g_ports[port];
}

int rlb_raw_frame(int port, int kind, int flags, uint32_t conn, uint32_t token, uint32_t fseq, uint32_t ack,
                  uint32_t msg_len, uint32_t offset, uint32_t frag_len, const uint8_t *payload, uint32_t payload_len,
                  uint8_t *out, uint32_t cap)
{
    struct port *p = raw_port(port);
    if (!p) return -EBADF;
    if (HDR_LEN + (uint64_t)payload_len > cap) return fail(EMSGSIZE, "a frame of %u bytes does not fit in %u", HDR_LEN + payload_len, cap);
    struct rlb_hdr *h = frame_fill(out, &p->mac, flags & F_TO_LISTENER, payload_len);
    h->kind = (uint8_t)kind;
    h->flags = (uint8_t)flags;
    h->conn = conn;
    h->token = token;
    h->fseq = fseq;
    h->ack = ack;
    h->msg_len = msg_len;
    h->offset = offset;
    h->len = (uint16_t)frag_len;
    memcpy(h + 1, payload, payload_len);
    return (int)(HDR_LEN + payload_len);
}

int rlb_raw_send(int port, const uint8_t *frame, uint32_t len)
{
    struct port *p = raw_port(port);
    if (!p) return -EBADF;
    if (len > MBUF_ROOM) return fail(EMSGSIZE, "a frame of %u bytes is over %u", len, MBUF_ROOM);
    struct rte_mbuf *m = rte_pktmbuf_alloc(g_pool);
    if (!m) return fail(ENOBUFS, "no mbuf free");
    uint8_t *d = (uint8_t *)rte_pktmbuf_append(m, len);
    if (!d && len) { rte_pktmbuf_free(m); return fail(EMSGSIZE, "frame too long"); }
    memcpy(d, frame, len);
    if (rte_eth_tx_burst(p->pid, 0, &m, 1) == 1) return 1;
    rte_pktmbuf_free(m);
    return 0;
}

int rlb_raw_recv(int port, uint8_t *out, uint32_t cap, int *kind, int *reason)
{
    struct port *p = raw_port(port);
    if (!p) return -EBADF;
    struct rte_mbuf *m;
    if (rte_eth_rx_burst(p->pid, 0, &m, 1) != 1) return 0;
    uint32_t len = rte_pktmbuf_pkt_len(m);
    const uint8_t *d = rte_pktmbuf_read(m, 0, len < cap ? len : cap, out);
    if (d && d != out) memcpy(out, d, len < cap ? len : cap);
    struct rlb_hdr h;
    const struct rlb_hdr *hp = len >= HDR_LEN ? rte_pktmbuf_read(m, L2L4_LEN, sizeof(h), &h) : NULL;
    *kind = hp && hp->magic == RLB_MAGIC ? hp->kind : -1;
    *reason = hp && hp->magic == RLB_MAGIC ? hp->pad : 0;
    rte_pktmbuf_free(m);
    return (int)len;
}
