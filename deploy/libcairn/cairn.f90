! cairn.f90: Fortran interfaces (ISO_C_BINDING) to libcairn, the C client
! of cairn's rank API. See cairn.h for what each function does; every one
! returns 0 or a negative CAIRN_E* code.
!
!   gfortran -I/opt/cairn/include -c /opt/cairn/include/cairn.f90
!   gfortran prog.f90 cairn.o -L/opt/cairn/lib -lcairn -Wl,-rpath,/opt/cairn/lib
!
!   use cairn
!   type(cairn_info_t) :: info
!   type(cairn_result_t) :: res
!   if (cairn_info(info) == 0) print *, 'rank', info%rank, 'of', info%size
!   if (cairn_checkpoint(res) == 0 .and. res%state == CAIRN_RESTORED) &
!       print *, 'restored from', res%restored_from
!   ierr = cairn_event('phase'//c_null_char, 'step 1000 done'//c_null_char)
!
! Strings passed in end in c_null_char; the character arrays of
! cairn_info_t are NUL-terminated (cairn_string turns one into a string).
module cairn
  use, intrinsic :: iso_c_binding
  implicit none
  private
  public :: c_null_char, c_int
  public :: cairn_info_t, cairn_result_t
  public :: cairn_info, cairn_checkpoint, cairn_stop, cairn_event, cairn_strerror, cairn_string

  integer(c_int), parameter, public :: CAIRN_OK = 0, CAIRN_EBADREQUEST = -1, &
      CAIRN_EFORBIDDEN = -2, CAIRN_ENOTFOUND = -3, CAIRN_ERATELIMITED = -4, &
      CAIRN_EUNAVAILABLE = -5, CAIRN_EABORTED = -6, CAIRN_ECONFLICT = -7, &
      CAIRN_ENOENDPOINT = -8, CAIRN_EPROTO = -9, CAIRN_ESYS = -10, &
      CAIRN_EINVAL = -11, CAIRN_EBUSY = -12
  integer(c_int), parameter, public :: CAIRN_DONE = 1, CAIRN_RESTORED = 2
  integer, parameter, public :: CAIRN_JOB_MAX = 64, CAIRN_MODE_MAX = 16

  ! struct cairn_info
  type, bind(C) :: cairn_info_t
    character(kind=c_char) :: job(CAIRN_JOB_MAX)
    integer(c_int) :: rank, size
    character(kind=c_char) :: mode(CAIRN_MODE_MAX)
    integer(c_int) :: ckpt, restored, restored_from, incarnation
  end type

  ! struct cairn_result
  type, bind(C) :: cairn_result_t
    integer(c_int) :: state, ckpt, restored_from
  end type

  interface
    integer(c_int) function cairn_info(out) bind(C, name='cairn_info')
      import :: c_int, cairn_info_t
      type(cairn_info_t), intent(out) :: out
    end function

    integer(c_int) function cairn_checkpoint(out) bind(C, name='cairn_checkpoint')
      import :: c_int, cairn_result_t
      type(cairn_result_t), intent(out) :: out
    end function

    integer(c_int) function cairn_stop(out) bind(C, name='cairn_stop')
      import :: c_int, cairn_result_t
      type(cairn_result_t), intent(out) :: out
    end function

    integer(c_int) function cairn_event(kind, message) bind(C, name='cairn_event')
      import :: c_int, c_char
      character(kind=c_char), intent(in) :: kind(*), message(*)
    end function

    type(c_ptr) function c_strerror(code) bind(C, name='cairn_strerror')
      import :: c_int, c_ptr
      integer(c_int), value :: code
    end function

    integer(c_size_t) function c_strlen(s) bind(C, name='strlen')
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
    end function
  end interface

contains

  ! cairn_strerror says what a return code means.
  function cairn_strerror(code) result(msg)
    integer(c_int), intent(in) :: code
    character(len=:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    p = c_strerror(code)
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: msg)
    do i = 1, n
      msg(i:i) = chars(i)
    end do
  end function

  ! cairn_string turns a NUL-terminated character array (a field of
  ! cairn_info_t) into a string.
  function cairn_string(chars) result(s)
    character(kind=c_char), intent(in) :: chars(:)
    character(len=:), allocatable :: s
    integer :: i, n
    n = 0
    do while (n < size(chars))
      if (chars(n + 1) == c_null_char) exit
      n = n + 1
    end do
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function
end module cairn
