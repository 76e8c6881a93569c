// POSIX ACLs (FORMAT.md "Extended attributes"): the kernel enforces them (FUSE_CAP_POSIX_ACL)
// and writes them through system.posix_acl_access/default; the filesystem's own part is
// inheritance, when a directory with a default ACL gets a new entry (POSIX.1e, as Linux's
// posix_acl_create: the umask does not apply, the requested mode masks the inherited ACL).
#include <algorithm>
#include <cstring>

#include "internal.h"

namespace warpfs::fs::acl {

namespace {

// The xattr form (include/uapi/linux/posix_acl_xattr.h): a version-2 header, then entries.
constexpr uint32_t kVersion = 2;
constexpr uint16_t kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kGroup = 0x08, kMask = 0x10,
                   kOther = 0x20;
struct Entry {
  uint16_t tag;
  uint16_t perm;
  uint32_t id;
};
static_assert(sizeof(Entry) == 8);

// The entries of an xattr value, or false if it is no ACL.
bool parse(const std::string& v, std::vector<Entry>* e) {
  if (v.size() < 4 || (v.size() - 4) % sizeof(Entry) != 0) return false;
  uint32_t version;
  std::memcpy(&version, v.data(), 4);
  if (version != kVersion) return false;
  e->resize((v.size() - 4) / sizeof(Entry));
  std::memcpy(e->data(), v.data() + 4, e->size() * sizeof(Entry));
  return true;
}

std::string serialize(const std::vector<Entry>& e) {
  std::string v(4, '\0');
  std::memcpy(v.data(), &kVersion, 4);
  v.append(reinterpret_cast<const char*>(e.data()), e.size() * sizeof(Entry));
  return v;
}

}  // namespace

bool mode_of(const std::string& access_acl, uint32_t* perms, bool* equivalent) {
  std::vector<Entry> e;
  if (!parse(access_acl, &e)) return false;
  int user_obj = -1, group_obj = -1, mask = -1, other = -1;
  *equivalent = true;
  for (const Entry& x : e) {
    switch (x.tag) {
      case kUserObj:
        user_obj = x.perm & 7;
        break;
      case kGroupObj:
        group_obj = x.perm & 7;
        break;
      case kMask:
        mask = x.perm & 7;
        *equivalent = false;
        break;
      case kOther:
        other = x.perm & 7;
        break;
      case kUser:
      case kGroup:
        *equivalent = false;
        break;
      default:
        return false;
    }
  }
  if (user_obj < 0 || group_obj < 0 || other < 0) return false;
  *perms = static_cast<uint32_t>(user_obj << 6 | (mask >= 0 ? mask : group_obj) << 3 | other);
  return true;
}

bool chmod(std::string* access_acl, uint32_t mode) {
  std::vector<Entry> e;
  if (!parse(*access_acl, &e)) return false;
  const bool has_mask =
      std::any_of(e.begin(), e.end(), [](const Entry& x) { return x.tag == kMask; });
  for (Entry& x : e) {
    if (x.tag == kUserObj) x.perm = static_cast<uint16_t>((mode >> 6) & 7);
    if (x.tag == (has_mask ? kMask : kGroupObj)) x.perm = static_cast<uint16_t>((mode >> 3) & 7);
    if (x.tag == kOther) x.perm = static_cast<uint16_t>(mode & 7);
  }
  *access_acl = serialize(e);
  return true;
}

bool inherit(const std::string& default_acl, uint32_t* mode, std::string* access) {
  access->clear();
  std::vector<Entry> e;
  if (!parse(default_acl, &e)) return false;
  uint32_t m = *mode & 0777;
  bool extended = false;  // named users or groups, or a mask: more than the mode can say
  Entry* group_obj = nullptr;
  Entry* mask = nullptr;
  for (Entry& x : e) {
    switch (x.tag) {
      case kUserObj:
        x.perm &= (m >> 6) & 7;
        m &= (uint32_t{x.perm} << 6) | 077;
        break;
      case kOther:
        x.perm &= m & 7;
        m &= x.perm | 0770;
        break;
      case kGroupObj:
        group_obj = &x;
        break;
      case kMask:
        mask = &x;
        extended = true;
        break;
      case kUser:
      case kGroup:
        extended = true;
        break;
      default:
        return false;
    }
  }
  Entry* g = mask ? mask : group_obj;
  if (!g) return false;
  g->perm &= (m >> 3) & 7;
  m &= (uint32_t{g->perm} << 3) | 0707;
  *mode = (*mode & ~0777u) | m;
  if (extended) *access = serialize(e);
  return true;
}

}  // namespace warpfs::fs::acl
